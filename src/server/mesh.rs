//! The `anarchon.v1.Mesh` service: thin over [`crate::mesh::Mesh`].

use std::pin::Pin;
use std::sync::Arc;

use tonic::{Request, Response, Status, Streaming};

use crate::mesh::Mesh;
use crate::proto as pb;

pub struct MeshService(pub Arc<Mesh>);

type EventStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::PeerEvent, Status>> + Send>>;
type FrameStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::SyncFrame, Status>> + Send>>;

#[tonic::async_trait]
impl pb::mesh_server::Mesh for MeshService {
    type WatchPeersStream = EventStream;

    async fn watch_peers(
        &self,
        request: Request<pb::WatchPeersRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let include_expired = request.into_inner().include_expired;
        Ok(Response::new(Box::pin(self.0.watch(include_expired))))
    }

    async fn list_peers(
        &self,
        _: Request<pb::ListPeersRequest>,
    ) -> Result<Response<pb::ListPeersResponse>, Status> {
        Ok(Response::new(self.0.list()))
    }

    type SyncStream = FrameStream;

    async fn sync(
        &self,
        request: Request<Streaming<pb::SyncFrame>>,
    ) -> Result<Response<FrameStream>, Status> {
        let remote = request.remote_addr();
        let stream = self.0.clone().accept(request.into_inner(), remote).await?;
        Ok(Response::new(Box::pin(stream)))
    }
}
