//! The `anarchon.v1.Mesh` service. Until the mesh lands, `ListPeers` shows
//! this runtime alone and the streaming RPCs answer `UNIMPLEMENTED`.

use std::pin::Pin;
use std::time::Instant;

use tonic::{Request, Response, Status, Streaming};

use crate::proto as pb;

pub struct MeshService {
    pub node: String,
    pub instance: u64,
    pub address: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub started: Instant,
}

impl MeshService {
    pub fn self_peer(&self) -> pb::Peer {
        pb::Peer {
            node: self.node.clone(),
            instance: self.instance,
            restarts: 0,
            address: self.address.clone(),
            state: pb::PeerState::Alive as i32,
            link: pb::Link::Unspecified as i32,
            beat: 0,
            beat_age_ms: 0,
            labels: self.labels.clone().into_iter().collect(),
            node_name: self.labels.get("node_name").cloned().unwrap_or_default(),
        }
    }
}

type EventStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::PeerEvent, Status>> + Send>>;
type FrameStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::SyncFrame, Status>> + Send>>;

#[tonic::async_trait]
impl pb::mesh_server::Mesh for MeshService {
    type WatchPeersStream = EventStream;

    async fn watch_peers(
        &self,
        _: Request<pb::WatchPeersRequest>,
    ) -> Result<Response<EventStream>, Status> {
        Err(Status::unimplemented("the mesh is not in this build yet"))
    }

    async fn list_peers(
        &self,
        _: Request<pb::ListPeersRequest>,
    ) -> Result<Response<pb::ListPeersResponse>, Status> {
        Ok(Response::new(pb::ListPeersResponse {
            self_: Some(self.self_peer()),
            peers: Vec::new(),
        }))
    }

    type SyncStream = FrameStream;

    async fn sync(
        &self,
        _: Request<Streaming<pb::SyncFrame>>,
    ) -> Result<Response<FrameStream>, Status> {
        Err(Status::unimplemented("the mesh is not in this build yet"))
    }
}
