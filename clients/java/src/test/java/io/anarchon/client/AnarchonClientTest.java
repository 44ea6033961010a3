package io.anarchon.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import io.grpc.Status;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.After;
import org.junit.Before;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TestName;

/**
 * Tests against real sidecars started by clients/test.sh: ANARCHON_A and ANARCHON_B share
 * one SQLite file and are linked as peers; ANARCHON_A_PID is A's process id (the
 * lost-lease test pauses it); ANARCHON_C requires the bearer token ANARCHON_C_TOKEN.
 */
public class AnarchonClientTest {
  @Rule public TestName name = new TestName();

  private AnarchonClient a;
  private AnarchonClient b;
  private String job;

  static String env(String n) {
    String v = System.getenv(n);
    if (v == null || v.isEmpty()) {
      throw new IllegalStateException(n + " is not set: run the tests through clients/test.sh");
    }
    return v;
  }

  static long now() {
    return System.currentTimeMillis();
  }

  @Before
  public void setUp() {
    a = AnarchonClient.connect(env("ANARCHON_A"), null, Duration.ofSeconds(10));
    b = AnarchonClient.connect(env("ANARCHON_B"), null, Duration.ofSeconds(10));
    String n = name.getMethodName().replaceAll("[^A-Za-z0-9]", "-");
    job = "java-" + n.substring(0, Math.min(40, n.length())) + "-" + UUID.randomUUID().toString().substring(0, 8);
  }

  @After
  public void tearDown() {
    a.close();
    b.close();
  }

  @Test
  public void claimWonHasEveryField() {
    long slot = now();
    Claim c = a.claim(job, slot);
    assertTrue(c.won());
    assertEquals(Outcome.WON, c.outcome());
    assertEquals(32, c.token().length());
    assertEquals(1, c.attempt());
    assertTrue(c.fencing() >= 1);
    assertTrue(c.leaseUntilMs() > c.nowMs());
    assertTrue(c.validForMs() > 0 && c.validForMs() <= 30000);
    assertNotNull(c.holder());
    assertEquals("sqlite", c.backend());
    assertEquals(job, c.job());
    assertEquals(slot, c.slotMs());
    assertFalse(c.expired());
  }

  @Test
  public void contentionIsAnOutcome() {
    Claim first = a.claim(job, 0);
    Claim second = b.claim(job, 0);
    assertTrue(first.won());
    assertEquals(Outcome.RUNNING, second.outcome());
    assertEquals("", second.token());
    assertEquals(first.holder(), second.holder());
  }

  @Test
  public void resendSameToken() {
    Claim first = a.claim(job, 0);
    Claim again = a.claim(job, 0, ClaimOptions.defaults().token(first.token()));
    assertTrue(again.won());
    assertEquals(first.attempt(), again.attempt());
  }

  @Test
  public void lateAndOverlap() {
    Claim late = a.claim(job, 1000, ClaimOptions.defaults().maxLate(Duration.ofSeconds(1)));
    assertEquals(Outcome.LATE, late.outcome());
    assertEquals("too_late", late.reason());
    assertTrue(a.claim(job, now(), ClaimOptions.defaults().overlapAllow().maxAttempts(2)).won());
    assertEquals(Outcome.OVERLAP, a.claim(job, now() + 1, ClaimOptions.defaults().overlapSkip()).outcome());
  }

  @Test
  public void invalidJobNamesTheField() {
    AnarchonException.InvalidArgument e =
        assertThrows(AnarchonException.InvalidArgument.class, () -> a.claim("bad job!", 0));
    assertEquals("job", e.reason());
    assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
  }

  @Test
  public void renew() {
    Claim c = a.claim(job, 0, ClaimOptions.defaults().lease(Duration.ofSeconds(2)));
    Renewal r = a.renew(job, 0, c.token(), Duration.ofSeconds(5));
    assertEquals(1, r.attempt());
    assertEquals(c.fencing(), r.fencing());
    assertTrue(r.leaseUntilMs() > c.leaseUntilMs());
    assertTrue(r.validForMs() > 4000);
    assertEquals(1, a.renew(c).attempt());
  }

  @Test
  public void renewAfterReleaseIsFenced() {
    Claim c = a.claim(job, now());
    a.release(c, true);
    AnarchonException.Fenced e = assertThrows(AnarchonException.Fenced.class, () -> a.renew(c));
    assertEquals("fenced", e.reason());
    assertEquals(Status.Code.FAILED_PRECONDITION, e.code());
  }

  @Test
  public void renewUnknownRunIsNotFound() {
    assertThrows(AnarchonException.NotFound.class, () -> a.renew(job, 12345, "0".repeat(32), null));
  }

  @Test
  public void releaseSucceededThenDone() {
    long slot = now();
    Claim c = a.claim(job, slot);
    a.release(job, slot, c.token(), true);
    a.release(c, true); // idempotent
    Claim d = b.claim(job, slot);
    assertEquals(Outcome.DONE, d.outcome());
    assertEquals("succeeded", d.reason());
  }

  @Test
  public void releaseFailedAndHistory() {
    long base = now();
    for (int i = 0; i < 3; i++) {
      a.release(a.claim(job, base + i), i != 2);
    }
    List<Run> runs = a.history(job, 2);
    assertEquals(2, runs.size());
    assertEquals(base + 2, runs.get(0).slotMs());
    assertEquals("FAILED", runs.get(0).state());
    assertEquals("SUCCEEDED", runs.get(1).state());
    List<Run> older = a.history(job, 0, base + 1);
    assertEquals(1, older.size());
    assertEquals(base, older.get(0).slotMs());
  }

  @Test
  public void releaseWrongTokenIsFenced() {
    a.claim(job, 0);
    assertThrows(AnarchonException.Fenced.class, () -> a.release(job, 0, "f".repeat(32), true));
  }

  @Test
  public void claimWaits() throws Exception {
    Claim c = a.claim(job, 0);
    Thread t = new Thread(() -> {
      try {
        Thread.sleep(300);
      } catch (InterruptedException e) {
        return;
      }
      a.release(c, true);
    });
    t.start();
    long t0 = System.nanoTime();
    Claim w = b.claim(job, 0, ClaimOptions.defaults().waitFor(Duration.ofSeconds(5)));
    long ms = (System.nanoTime() - t0) / 1_000_000;
    t.join();
    assertTrue(w.won());
    assertTrue("waited " + ms, ms >= 200 && ms < 4000);
  }

  @Test
  public void holdSuccess() throws Exception {
    long slot = now();
    Hold h;
    try (Hold hold = a.hold(job, slot, ClaimOptions.defaults().lease(Duration.ofMillis(600)))) {
      h = hold;
      assertTrue(hold.won());
      assertEquals(1, hold.claim().attempt());
      assertTrue(hold.awaitRenewal(Duration.ofSeconds(3)));
      assertTrue(hold.awaitRenewal(Duration.ofSeconds(3)));
      Thread.sleep(700); // longer than the lease: only renewals keep it
      hold.check();
      assertEquals(Outcome.RUNNING, b.claim(job, slot).outcome());
      hold.succeeded();
    }
    assertFalse(h.lost());
    assertTrue(h.renewals() >= 2);
    assertEquals("SUCCEEDED", a.history(job, 1).get(0).state());
    assertEquals(Outcome.DONE, b.claim(job, slot).outcome());
  }

  @Test
  public void holdFailure() {
    long slot = now();
    IllegalStateException e = assertThrows(IllegalStateException.class, () -> {
      try (Hold hold = a.hold(job, slot)) {
        assertTrue(hold.won());
        throw new IllegalStateException("boom");
      }
    });
    assertEquals("boom", e.getMessage());
    assertEquals(0, e.getSuppressed().length);
    assertEquals("FAILED", a.history(job, 1).get(0).state());
  }

  @Test
  public void holdNotWon() {
    Claim held = a.claim(job, 0);
    try (Hold hold = b.hold(job, 0)) {
      assertFalse(hold.won());
      assertEquals(Outcome.RUNNING, hold.claim().outcome());
    }
    assertEquals(1, a.renew(held).attempt());
  }

  /**
   * Pauses sidecar A (SIGSTOP) right after a renewal, so the 600 ms lease lapses; B
   * takes the run over (attempt 2); once A resumes its next renewal is fenced and
   * LOST_LEASE reaches the hold: check() throws, the registered thread is interrupted,
   * and close() throws too.
   */
  @Test
  public void holdLostLease() throws Exception {
    String pid = env("ANARCHON_A_PID");
    AtomicInteger callbacks = new AtomicInteger();
    boolean interrupted = false;
    Claim taken;
    Hold h = null;
    try (Hold hold = a.hold(job, 0, ClaimOptions.defaults().lease(Duration.ofMillis(600)))) {
      h = hold;
      hold.onLost(callbacks::incrementAndGet).interruptOnLoss();
      assertTrue(hold.won());
      assertTrue(hold.awaitRenewal(Duration.ofSeconds(3)));
      signal("STOP", pid);
      try {
        Thread.sleep(1000);
        assertTrue(hold.claim().expired());
        taken = b.claim(job, 0);
      } finally {
        signal("CONT", pid);
      }
      assertTrue(taken.won());
      assertEquals(2, taken.attempt());
      try {
        Thread.sleep(5000);
      } catch (InterruptedException e) {
        interrupted = true;
      }
      assertTrue(interrupted);
      assertTrue(hold.lost());
      assertEquals("fenced", hold.lostReason());
      LeaseLostException e = assertThrows(LeaseLostException.class, hold::check);
      assertEquals("fenced", e.reason());
      fail("close() must throw"); // reached: close() below throws LeaseLostException, suppressed into this
    } catch (AssertionError err) {
      if (!"close() must throw".equals(err.getMessage())) {
        throw err;
      }
      assertEquals(1, err.getSuppressed().length);
      assertTrue(err.getSuppressed()[0] instanceof LeaseLostException);
    }
    assertEquals(1, callbacks.get());
    assertFalse("our interrupt must not leak", Thread.currentThread().isInterrupted());
    assertEquals(2, b.history(job, 1).get(0).attempt());
  }

  static void signal(String sig, String pid) throws Exception {
    Process p = new ProcessBuilder("kill", "-" + sig, pid).inheritIO().start();
    assertEquals(0, p.waitFor());
  }

  @Test
  public void peers() {
    Peers pa = a.peers();
    Peers pb = b.peers();
    assertEquals("ALIVE", pa.self().state());
    assertFalse(pa.self().node().equals(pb.self().node()));
    assertTrue(pa.peers().stream().anyMatch(
        p -> p.node().equals(pb.self().node()) && p.state().equals("ALIVE")
            && p.instance() == pb.self().instance()));
  }

  @Test
  public void watchPeers() {
    String other = b.peers().self().node();
    List<PeerEvent> seen = new ArrayList<>();
    try (PeerWatch w = a.watchPeers()) {
      while (w.hasNext()) {
        PeerEvent ev = w.next();
        seen.add(ev);
        if (ev.peer().node().equals(other)) {
          break;
        }
      }
      w.close();
      assertFalse(w.hasNext());
    }
    try (PeerWatch w = a.watchPeers(true)) {
      assertEquals("SNAPSHOT", w.next().kind());
    }
    assertTrue(seen.stream().allMatch(e -> e.kind().equals("SNAPSHOT")));
    assertEquals(other, seen.get(seen.size() - 1).peer().node());
  }

  @Test
  public void bearerToken() {
    try (AnarchonClient good = AnarchonClient.connect(env("ANARCHON_C"), env("ANARCHON_C_TOKEN"), Duration.ofSeconds(10));
        AnarchonClient bad = AnarchonClient.connect(env("ANARCHON_C"))) {
      assertTrue(good.claim("java-auth", now()).won());
      assertNotNull(good.peers().self().node());
      assertThrows(AnarchonException.Unauthenticated.class, () -> bad.claim("java-auth", 0));
    }
  }
}
