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

#[path = "../tests/common/s3.rs"]
mod s3;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [root, port, access, secret] = &args[..] else {
        eprintln!("usage: s3_server DIR PORT ACCESS_KEY SECRET_KEY");
        std::process::exit(2);
    };
    let port: u16 = port.parse().expect("a port");
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("binding the port");
    eprintln!(
        "s3s-fs on http://{}, objects under {root}",
        listener.local_addr().unwrap()
    );
    s3::serve(std::path::Path::new(root), listener, access, secret).await;
}
