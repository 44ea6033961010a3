//! An in-test TCP fault proxy placed in front of a sidecar's listener.
//!
//! Every runtime advertises its proxy, so every link into a runtime passes
//! through it. A connection is tagged with the dialer's node id: the first
//! known node id in the client→server bytes (the hello, or the dialer's own
//! mark, which leads every frame). `block(node)` cuts that dialer's links
//! and refuses new ones until `unblock(node)`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone)]
pub struct FaultProxy {
    pub addr: SocketAddr,
    blocked: Arc<Mutex<HashSet<String>>>,
    /// Bumped whenever the blocked set changes, so live links re-check.
    changed: watch::Sender<u64>,
}

impl FaultProxy {
    pub async fn start(target: SocketAddr, nodes: Vec<String>) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (changed, _) = watch::channel(0u64);
        let p = FaultProxy {
            addr,
            blocked: Default::default(),
            changed,
        };
        let me = p.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let me = me.clone();
                let nodes = nodes.clone();
                tokio::spawn(async move {
                    let _ = me.pipe(inbound, target, nodes).await;
                });
            }
        });
        p
    }

    pub fn block(&self, node: &str) {
        self.blocked.lock().unwrap().insert(node.to_owned());
        self.changed.send_modify(|n| *n += 1);
    }

    pub fn unblock(&self, node: &str) {
        self.blocked.lock().unwrap().remove(node);
        self.changed.send_modify(|n| *n += 1);
    }

    fn is_blocked(&self, tag: &Option<String>) -> bool {
        tag.as_ref()
            .is_some_and(|t| self.blocked.lock().unwrap().contains(t))
    }

    async fn pipe(
        &self,
        inbound: TcpStream,
        target: SocketAddr,
        nodes: Vec<String>,
    ) -> std::io::Result<()> {
        let outbound = TcpStream::connect(target).await?;
        let (mut ir, mut iw) = inbound.into_split();
        let (mut or, mut ow) = outbound.into_split();
        let mut changed = self.changed.subscribe();
        let mut seen: Vec<u8> = Vec::new();
        let mut tag: Option<String> = None;
        let mut up = [0u8; 16 << 10];
        let mut down = [0u8; 16 << 10];
        loop {
            tokio::select! {
                n = ir.read(&mut up) => {
                    let n = n?;
                    if n == 0 { return Ok(()); }
                    if tag.is_none() {
                        seen.extend_from_slice(&up[..n]);
                        let text = String::from_utf8_lossy(&seen);
                        tag = nodes
                            .iter()
                            .filter_map(|id| text.find(id.as_str()).map(|at| (at, id)))
                            .min()
                            .map(|(_, id)| id.clone());
                    }
                    if self.is_blocked(&tag) { return Ok(()); }
                    ow.write_all(&up[..n]).await?;
                }
                n = or.read(&mut down) => {
                    let n = n?;
                    if n == 0 { return Ok(()); }
                    if self.is_blocked(&tag) { return Ok(()); }
                    iw.write_all(&down[..n]).await?;
                }
                _ = changed.changed() => {
                    if self.is_blocked(&tag) { return Ok(()); }
                }
            }
        }
    }
}
