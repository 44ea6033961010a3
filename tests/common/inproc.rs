//! An in-process sidecar on port 0, stopped when dropped.

use std::net::SocketAddr;
use std::time::Duration;

use anarchon::proto::claims_client::ClaimsClient;
use anarchon::proto::mesh_client::MeshClient;
use anarchon::server::{self, Listeners};
use anarchon::Config;
use tokio::net::TcpListener;
use tonic::transport::Channel;

pub struct InProc {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub dir: tempfile::TempDir,
    pub backend: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl InProc {
    /// Starts a sidecar on SQLite in a fresh directory, with `tune` applied.
    pub async fn start(tune: impl FnOnce(&mut Config)) -> InProc {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config {
            data_dir: dir.path().join("data"),
            heartbeat_ms: 100,
            expiry_ms: 1000,
            ..Config::default()
        };
        tune(&mut cfg);
        let backend = cfg.backend_url();
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let unix = (!cfg.listen_unix.as_os_str().is_empty())
            .then(|| server::UnixSocket::bind(&cfg.listen_unix, cfg.listen_unix_group).unwrap());
        let addr = grpc.local_addr().unwrap();
        let admin_addr = admin.local_addr().unwrap();
        cfg.listen = addr;
        cfg.admin_listen = admin_addr;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server::run(
            cfg,
            Listeners {
                grpc,
                admin: Some(admin),
                unix,
            },
            async move {
                let _ = rx.await;
            },
        ));
        let s = InProc {
            addr,
            admin: admin_addr,
            dir,
            backend,
            stop: Some(tx),
            task: Some(task),
        };
        for _ in 0..200 {
            if Channel::from_shared(s.url())
                .unwrap()
                .connect()
                .await
                .is_ok()
            {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("in-process sidecar did not start");
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.url())
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    pub async fn claims(&self) -> ClaimsClient<Channel> {
        ClaimsClient::new(self.channel().await)
    }

    pub async fn mesh(&self) -> MeshClient<Channel> {
        MeshClient::new(self.channel().await)
    }

    /// Stops the sidecar (SIGTERM path) and waits for it.
    pub async fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap().unwrap();
        }
    }
}

impl Drop for InProc {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}
