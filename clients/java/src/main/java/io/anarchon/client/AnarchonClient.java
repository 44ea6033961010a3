package io.anarchon.client;

import io.anarchon.v1.ClaimRequest;
import io.anarchon.v1.ClaimResponse;
import io.anarchon.v1.ClaimsGrpc;
import io.anarchon.v1.HistoryRequest;
import io.anarchon.v1.HistoryResponse;
import io.anarchon.v1.ListPeersRequest;
import io.anarchon.v1.ListPeersResponse;
import io.anarchon.v1.MeshGrpc;
import io.anarchon.v1.ReleaseRequest;
import io.anarchon.v1.ReleaseResult;
import io.anarchon.v1.RenewRequest;
import io.anarchon.v1.RenewResponse;
import io.anarchon.v1.WatchPeersRequest;
import io.grpc.ClientInterceptor;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.AbstractStub;
import io.grpc.stub.MetadataUtils;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A client of one anarchon sidecar: who owns a (job, slot), and who is alive.
 * Thread-safe; close it to close the channel it opened.
 *
 * <pre>{@code
 * try (AnarchonClient client = AnarchonClient.connect("127.0.0.1:50051");
 *      Hold hold = client.hold("nightly-report", slotMs)) {
 *   if (hold.won()) {
 *     build(hold.claim().fencing());
 *     hold.succeeded();   // close() releases SUCCEEDED; without this, FAILED
 *   }
 * }
 * }</pre>
 */
public final class AnarchonClient implements AutoCloseable {
  /** The sidecar's default gRPC address. */
  public static final String DEFAULT_TARGET = "127.0.0.1:50051";

  private final ManagedChannel channel;
  private final boolean ownsChannel;
  private final ClientInterceptor[] interceptors;
  private final Duration timeout;

  /**
   * Uses {@code channel}; {@code token} (nullable) is sent as {@code authorization:
   * Bearer <token>}; {@code timeout} (nullable) is the default deadline of unary calls.
   * The channel stays open when this client is closed.
   */
  public AnarchonClient(ManagedChannel channel, String token, Duration timeout) {
    this(channel, false, token, timeout);
  }

  private AnarchonClient(ManagedChannel channel, boolean owns, String token, Duration timeout) {
    this.channel = channel;
    this.ownsChannel = owns;
    this.timeout = timeout;
    if (token != null && !token.isEmpty()) {
      Metadata md = new Metadata();
      md.put(Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER), "Bearer " + token);
      this.interceptors = new ClientInterceptor[] {MetadataUtils.newAttachHeadersInterceptor(md)};
    } else {
      this.interceptors = new ClientInterceptor[0];
    }
  }

  /** A plaintext connection to {@code target} ("host:port"), as suits a sidecar on loopback. */
  public static AnarchonClient connect(String target) {
    return connect(target, null, null);
  }

  /** A plaintext connection sending the bearer {@code token} (nullable), with a default deadline (nullable). */
  public static AnarchonClient connect(String target, String token, Duration timeout) {
    ManagedChannel ch = ManagedChannelBuilder.forTarget(target).usePlaintext().build();
    return new AnarchonClient(ch, true, token, timeout);
  }

  @Override
  public void close() {
    if (ownsChannel) {
      channel.shutdownNow();
      try {
        channel.awaitTermination(5, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
  }

  private <S extends AbstractStub<S>> S prepare(S stub, long extraMs) {
    S s = stub.withInterceptors(interceptors);
    if (timeout != null) {
      s = s.withDeadlineAfter(timeout.toMillis() + extraMs, TimeUnit.MILLISECONDS);
    }
    return s;
  }

  ClaimsGrpc.ClaimsBlockingStub claims(long extraMs) {
    return prepare(ClaimsGrpc.newBlockingStub(channel), extraMs);
  }

  ClaimsGrpc.ClaimsStub claimsAsync() {
    return ClaimsGrpc.newStub(channel).withInterceptors(interceptors);
  }

  private MeshGrpc.MeshBlockingStub mesh() {
    return prepare(MeshGrpc.newBlockingStub(channel), 0);
  }

  /** Asks who owns (job, slotMs) with the sidecar's defaults. Slot 0 is a lock not tied to time. */
  public Claim claim(String job, long slotMs) {
    return claim(job, slotMs, ClaimOptions.defaults());
  }

  /** Asks who owns (job, slotMs). Contention is an outcome ({@link Claim#outcome()}), never an exception. */
  public Claim claim(String job, long slotMs, ClaimOptions options) {
    ClaimRequest req = options.request(job, slotMs);
    long sent = System.nanoTime();
    try {
      ClaimResponse r = claims(options.waitMs()).claim(req);
      return Claim.of(job, slotMs, r, sent);
    } catch (StatusRuntimeException e) {
      throw AnarchonException.from(e);
    }
  }

  /** Extends the lease of a held claim (default lease). */
  public Renewal renew(Claim claim) {
    return renew(claim.job(), claim.slotMs(), claim.token(), null);
  }

  /**
   * Extends the lease ({@code lease} nullable: the default).
   *
   * @throws AnarchonException.Fenced when the token no longer holds the run
   */
  public Renewal renew(String job, long slotMs, String token, Duration lease) {
    long sent = System.nanoTime();
    try {
      RenewResponse r = claims(0).renew(RenewRequest.newBuilder()
          .setJob(job).setSlotMs(slotMs).setToken(token)
          .setLeaseMs(lease == null ? 0 : lease.toMillis()).build());
      return new Renewal(r.getLeaseUntilMs(), r.getAttempt(), r.getValidForMs(), r.getFencing(),
          sent + r.getValidForMs() * 1_000_000L);
    } catch (StatusRuntimeException e) {
      throw AnarchonException.from(e);
    }
  }

  /** Finishes a held claim, SUCCEEDED or FAILED. */
  public void release(Claim claim, boolean succeeded) {
    release(claim.job(), claim.slotMs(), claim.token(), succeeded);
  }

  /**
   * Finishes a held run, SUCCEEDED or FAILED. Idempotent for the same token.
   *
   * @throws AnarchonException.Fenced for a token that does not hold the run
   */
  public void release(String job, long slotMs, String token, boolean succeeded) {
    try {
      claims(0).release(ReleaseRequest.newBuilder()
          .setJob(job).setSlotMs(slotMs).setToken(token)
          .setResult(succeeded ? ReleaseResult.RELEASE_RESULT_SUCCEEDED : ReleaseResult.RELEASE_RESULT_FAILED)
          .build());
    } catch (StatusRuntimeException e) {
      throw AnarchonException.from(e);
    }
  }

  /** {@link #hold(String, long, ClaimOptions)} with the sidecar's defaults. */
  public Hold hold(String job, long slotMs) {
    return hold(job, slotMs, ClaimOptions.defaults());
  }

  /**
   * Claims (job, slotMs) on the sidecar's Hold stream, which renews the lease every
   * lease/3 while the returned {@link Hold} is open. Use it in try-with-resources;
   * see {@link Hold} for what {@code close()} does.
   */
  public Hold hold(String job, long slotMs, ClaimOptions options) {
    return Hold.open(this, job, slotMs, options);
  }

  /** Runs of a job, newest slot first: at most {@code limit} (0 = 20). */
  public List<Run> history(String job, int limit) {
    return history(job, limit, null);
  }

  /** Runs of a job with slot before {@code beforeSlotMs} (nullable), newest first. */
  public List<Run> history(String job, int limit, Long beforeSlotMs) {
    HistoryRequest.Builder b = HistoryRequest.newBuilder().setJob(job).setLimit(limit);
    if (beforeSlotMs != null) {
      b.setBeforeSlotMs(beforeSlotMs);
    }
    try {
      HistoryResponse r = claims(0).history(b.build());
      List<Run> runs = new ArrayList<>();
      for (io.anarchon.v1.Run x : r.getRunsList()) {
        runs.add(Run.of(x));
      }
      return runs;
    } catch (StatusRuntimeException e) {
      throw AnarchonException.from(e);
    }
  }

  /** A snapshot of the sidecar's mesh view. */
  public Peers peers() {
    try {
      ListPeersResponse r = mesh().listPeers(ListPeersRequest.getDefaultInstance());
      List<Peer> peers = new ArrayList<>();
      for (io.anarchon.v1.Peer p : r.getPeersList()) {
        peers.add(Peer.of(p));
      }
      return new Peers(Peer.of(r.getSelf()), List.copyOf(peers));
    } catch (StatusRuntimeException e) {
      throw AnarchonException.from(e);
    }
  }

  /** {@link #watchPeers(boolean)} without expired runtimes. */
  public PeerWatch watchPeers() {
    return watchPeers(false);
  }

  /**
   * Streams peer events: one SNAPSHOT per known runtime, then one event per change.
   * The returned iterator blocks in {@code hasNext()}; close it to stop.
   */
  public PeerWatch watchPeers(boolean includeExpired) {
    return new PeerWatch(MeshGrpc.newBlockingStub(channel).withInterceptors(interceptors),
        WatchPeersRequest.newBuilder().setIncludeExpired(includeExpired).build());
  }
}
