//! An S3-compatible server for the remote dataset store's tests and its
//! example (`examples/s3_server.rs` includes this file): s3s-fs over a
//! directory (buckets are its subdirectories), SigV4 with one key pair,
//! served by hyper on `listener` until the process ends.

use std::path::Path;

pub async fn serve(root: &Path, listener: tokio::net::TcpListener, access: &str, secret: &str) {
    let fs = s3s_fs::FileSystem::new(root).expect("the S3 root directory");
    let mut b = s3s::service::S3ServiceBuilder::new(fs);
    b.set_auth(s3s::auth::SimpleAuth::from_single(access, secret));
    let service = b.build().into_shared();
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
