package io.anarchon.client;

import io.anarchon.v1.MeshGrpc;
import io.anarchon.v1.WatchPeersRequest;
import io.grpc.Context;
import io.grpc.StatusRuntimeException;
import java.util.Iterator;
import java.util.NoSuchElementException;

/**
 * A blocking iterator of {@link PeerEvent}s. {@link #close()} (from any thread) ends
 * it: {@code hasNext()} then returns false.
 */
public final class PeerWatch implements Iterator<PeerEvent>, AutoCloseable {
  private final Context.CancellableContext ctx;
  private final Iterator<io.anarchon.v1.PeerEvent> it;
  private volatile boolean closed;

  PeerWatch(MeshGrpc.MeshBlockingStub stub, WatchPeersRequest req) {
    this.ctx = Context.current().withCancellation();
    Context prev = ctx.attach();
    try {
      this.it = stub.watchPeers(req);
    } finally {
      ctx.detach(prev);
    }
  }

  @Override
  public boolean hasNext() {
    if (closed) {
      return false;
    }
    try {
      return it.hasNext();
    } catch (StatusRuntimeException e) {
      if (closed) {
        return false;
      }
      throw AnarchonException.from(e);
    }
  }

  @Override
  public PeerEvent next() {
    if (!hasNext()) {
      throw new NoSuchElementException();
    }
    return PeerEvent.of(it.next());
  }

  @Override
  public void close() {
    closed = true;
    ctx.cancel(null);
  }
}
