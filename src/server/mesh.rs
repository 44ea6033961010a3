//! The `anarchon.v1.Mesh` service: thin over [`crate::mesh::Mesh`].

use std::pin::Pin;
use std::sync::Arc;

use tonic::{Request, Response, Status, Streaming};

use super::auth::Auth;
use crate::mesh::Mesh;
use crate::proto as pb;

/// `WatchPeers` and `ListPeers` are application calls (bearer token);
/// `Sync` is the peer link (mesh secret and proof of key).
pub struct MeshService {
    pub mesh: Arc<Mesh>,
    pub auth: Auth,
}

type EventStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::PeerEvent, Status>> + Send>>;
type FrameStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::SyncFrame, Status>> + Send>>;

#[tonic::async_trait]
impl pb::mesh_server::Mesh for MeshService {
    type WatchPeersStream = EventStream;

    async fn watch_peers(
        &self,
        request: Request<pb::WatchPeersRequest>,
    ) -> Result<Response<EventStream>, Status> {
        self.auth.check(request.metadata())?;
        let include_expired = request.into_inner().include_expired;
        Ok(Response::new(Box::pin(self.mesh.watch(include_expired))))
    }

    async fn list_peers(
        &self,
        request: Request<pb::ListPeersRequest>,
    ) -> Result<Response<pb::ListPeersResponse>, Status> {
        self.auth.check(request.metadata())?;
        Ok(Response::new(self.mesh.list()))
    }

    type SyncStream = FrameStream;

    async fn sync(
        &self,
        request: Request<Streaming<pb::SyncFrame>>,
    ) -> Result<Response<FrameStream>, Status> {
        let remote = request.remote_addr();
        let stream = self
            .mesh
            .clone()
            .accept(request.into_inner(), remote)
            .await?;
        Ok(Response::new(Box::pin(stream)))
    }
}
