//! A local S3-compatible server for trying the remote dataset store (and
//! for BENCHMARKS.md's measurements): s3s-fs over a directory, SigV4 with
//! the given keys, on loopback.
//!
//!   cargo run --release -p pgfleet-agent --example s3_server -- DIR PORT ACCESS_KEY SECRET_KEY
//!
//! Buckets are DIR's subdirectories (create `DIR/datasets` for
//! s3://datasets/...). Then, in another shell:
//!
//!   AWS_ENDPOINT_URL=http://127.0.0.1:PORT AWS_ACCESS_KEY_ID=ACCESS_KEY \
//!   AWS_SECRET_ACCESS_KEY=SECRET_KEY AWS_REGION=us-east-1 \
//!   pgfleet run SCENARIO --dataset-remote s3://datasets/pgfleet

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [root, port, access, secret] = &args[..] else {
        eprintln!("usage: s3_server DIR PORT ACCESS_KEY SECRET_KEY");
        std::process::exit(2);
    };
    let fs = s3s_fs::FileSystem::new(root).expect("the root directory");
    let mut b = s3s::service::S3ServiceBuilder::new(fs);
    b.set_auth(s3s::auth::SimpleAuth::from_single(
        access.as_str(),
        secret.as_str(),
    ));
    let service = b.build().into_shared();
    let listener =
        tokio::net::TcpListener::bind(("127.0.0.1", port.parse::<u16>().expect("a port")))
            .await
            .expect("binding the port");
    eprintln!(
        "s3s-fs on http://{}, objects under {root}",
        listener.local_addr().unwrap()
    );
    loop {
        let Ok((socket, _)) = listener.accept().await else {
            continue;
        };
        let service = service.clone();
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(socket), service)
                .await;
        });
    }
}
