package io.anarchon.client;

import io.anarchon.v1.ClaimRequest;
import io.anarchon.v1.HoldEvent;
import io.anarchon.v1.HoldEventKind;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

/**
 * A run claimed on the sidecar's Hold stream; the sidecar renews its lease every
 * lease/3 while this is open. Use it in try-with-resources:
 *
 * <ul>
 *   <li>Not won ({@link #won()} false): nothing is held, {@code close()} does nothing.
 *   <li>{@link #succeeded()} called, then closed: released SUCCEEDED.
 *   <li>Closed without {@link #succeeded()} (the block threw, or forgot): released FAILED.
 *   <li>The lease is lost (LOST_LEASE from the sidecar, or the stream broke): {@link
 *       #lost()} turns true, the {@link #onLost(Runnable)} callback runs, a thread
 *       registered with {@link #interruptOnLoss()} is interrupted, the next {@link
 *       #check()} throws {@link LeaseLostException}, and so does {@code close()} (as a
 *       suppressed exception if the block threw). Nothing is released.
 * </ul>
 */
public final class Hold implements AutoCloseable {
  private final AnarchonClient client;
  private final String job;
  private final long slotMs;
  private final long sentNanos;
  private final CompletableFuture<HoldEvent> first = new CompletableFuture<>();
  private final CountDownLatch lostLatch = new CountDownLatch(1);
  private final Object renewalLock = new Object();
  private volatile ClientCallStreamObserver<ClaimRequest> call;
  private volatile Claim claim;
  private volatile int renewals;
  private volatile String lostReason;
  private volatile boolean released;
  private volatile boolean succeeded;
  private volatile boolean closing;
  private volatile Thread interruptOnLoss;
  private volatile Runnable onLost;

  private Hold(AnarchonClient client, String job, long slotMs) {
    this.client = client;
    this.job = job;
    this.slotMs = slotMs;
    this.sentNanos = System.nanoTime();
  }

  static Hold open(AnarchonClient client, String job, long slotMs, ClaimOptions options) {
    Hold h = new Hold(client, job, slotMs);
    client.claimsAsync().hold(options.request(job, slotMs), h.new Observer());
    try {
      h.first.get();
    } catch (ExecutionException e) {
      throw AnarchonException.from(e.getCause());
    } catch (InterruptedException e) {
      h.cancel();
      Thread.currentThread().interrupt();
      throw new AnarchonException(io.grpc.Status.Code.CANCELLED, null, "interrupted", e);
    }
    if (!h.claim.won()) {
      h.cancel();
    }
    return h;
  }

  private final class Observer implements ClientResponseObserver<ClaimRequest, HoldEvent> {
    @Override
    public void beforeStart(ClientCallStreamObserver<ClaimRequest> requestStream) {
      call = requestStream;
    }

    @Override
    public void onNext(HoldEvent ev) {
      if (!first.isDone()) {
        if (ev.getKind() != HoldEventKind.HOLD_EVENT_KIND_CLAIMED || !ev.hasClaim()) {
          first.completeExceptionally(new AnarchonException(io.grpc.Status.Code.INTERNAL, null,
              "unexpected first Hold event " + ev.getKind(), null));
          return;
        }
        claim = Claim.of(job, slotMs, ev.getClaim(), sentNanos);
        first.complete(ev);
        return;
      }
      switch (ev.getKind()) {
        case HOLD_EVENT_KIND_RENEWED:
          synchronized (renewalLock) {
            // hold_valid_for_ms counts from the send of the Hold request:
            // safe even for an event that sat in a buffer while we were paused.
            long deadline = ev.getHoldValidForMs() > 0
                ? sentNanos + ev.getHoldValidForMs() * 1_000_000L
                : System.nanoTime() + ev.getValidForMs() * 1_000_000L;
            claim = claim.withLease(ev.getLeaseUntilMs(), ev.getValidForMs(), deadline);
            renewals++;
            renewalLock.notifyAll();
          }
          break;
        case HOLD_EVENT_KIND_LOST_LEASE:
          lose(ev.getReason().isEmpty() ? "lost" : ev.getReason());
          break;
        case HOLD_EVENT_KIND_RELEASED:
          released = true;
          break;
        default:
          break;
      }
    }

    @Override
    public void onError(Throwable t) {
      if (!first.isDone()) {
        first.completeExceptionally(t);
      } else if (!closing && !released) {
        lose("stream_broken");
      }
    }

    @Override
    public void onCompleted() {
      if (!first.isDone()) {
        first.completeExceptionally(new AnarchonException(io.grpc.Status.Code.UNAVAILABLE, null,
            "the Hold stream ended before its first event", null));
      } else if (!closing && !released && lostReason == null && claim.won()) {
        lose("stream_ended");
      }
    }
  }

  private void lose(String reason) {
    synchronized (renewalLock) {
      if (lostReason != null) {
        return;
      }
      lostReason = reason;
      renewalLock.notifyAll();
    }
    lostLatch.countDown();
    Runnable cb = onLost;
    if (cb != null) {
      cb.run();
    }
    Thread t = interruptOnLoss;
    if (t != null) {
      t.interrupt();
    }
  }

  private void cancel() {
    closing = true;
    ClientCallStreamObserver<ClaimRequest> c = call;
    if (c != null) {
      c.cancel("hold closed", null);
    }
  }

  /** Whether the claim was won (else nothing is held). */
  public boolean won() {
    return claim.won();
  }

  /** The claim; its lease fields follow the renewals. */
  public Claim claim() {
    return claim;
  }

  /** The number of lease renewals so far. */
  public int renewals() {
    return renewals;
  }

  /** Whether the lease was lost. */
  public boolean lost() {
    return lostReason != null;
  }

  /** Why the lease was lost ("fenced", "unavailable", "stream_broken"), or null. */
  public String lostReason() {
    return lostReason;
  }

  /** Waits up to {@code d} for the lease to be lost; true if it was. */
  public boolean awaitLoss(Duration d) throws InterruptedException {
    return lostLatch.await(d.toMillis(), TimeUnit.MILLISECONDS);
  }

  /** Waits up to {@code d} for the next renewal; true if one came. */
  public boolean awaitRenewal(Duration d) throws InterruptedException {
    long end = System.nanoTime() + d.toNanos();
    synchronized (renewalLock) {
      int seen = renewals;
      while (renewals == seen && lostReason == null) {
        long left = end - System.nanoTime();
        if (left <= 0) {
          break;
        }
        TimeUnit.NANOSECONDS.timedWait(renewalLock, left);
      }
      return renewals > seen;
    }
  }

  /**
   * Throws {@link LeaseLostException} if the lease was lost, or if the safe local
   * deadline passed without a renewal (reason "expired"). Call it between steps.
   */
  public void check() {
    String r = lostReason;
    if (r != null) {
      throw new LeaseLostException(r);
    }
    if (claim.won() && !released && claim.expired()) {
      throw new LeaseLostException("expired");
    }
  }

  /** Runs {@code callback} (on a gRPC thread) when the lease is lost. */
  public Hold onLost(Runnable callback) {
    this.onLost = callback;
    if (lostReason != null) {
      callback.run();
    }
    return this;
  }

  /** Interrupts the calling thread when the lease is lost. */
  public Hold interruptOnLoss() {
    this.interruptOnLoss = Thread.currentThread();
    if (lostReason != null) {
      Thread.currentThread().interrupt();
    }
    return this;
  }

  /** Marks the work done: {@code close()} then releases SUCCEEDED instead of FAILED. */
  public void succeeded() {
    this.succeeded = true;
  }

  /**
   * Releases the run (SUCCEEDED if {@link #succeeded()} was called, else FAILED) and
   * closes the stream; throws {@link LeaseLostException} if the lease was lost.
   */
  @Override
  public void close() {
    if (closing) {
      return;
    }
    Thread mine = interruptOnLoss;
    interruptOnLoss = null;
    try {
      if (!claim.won()) {
        return;
      }
      if (lostReason != null) {
        if (mine == Thread.currentThread()) {
          Thread.interrupted(); // our own interrupt: do not leak it
        }
        throw new LeaseLostException(lostReason);
      }
      if (!released) {
        try {
          client.release(job, slotMs, claim.token(), succeeded);
          released = true;
        } catch (AnarchonException.Fenced f) {
          lose("fenced");
          throw new LeaseLostException("fenced");
        }
      }
    } finally {
      cancel();
    }
  }
}
