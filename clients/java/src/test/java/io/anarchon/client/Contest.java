package io.anarchon.client;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * The Java claimer of the clients' contest (run by clients/test.sh): one thread per
 * sidecar claims slot i of CONTEST_JOB at CONTEST_START_MS + 30 ms * i, prints one line
 * per claim ("java SIDECAR SLOT OUTCOME ATTEMPT") and releases what it won.
 */
public final class Contest {
  private static final long STEP_MS = 30;

  public static void main(String[] args) throws Exception {
    String job = System.getenv("CONTEST_JOB");
    long base = Long.parseLong(System.getenv("CONTEST_BASE"));
    int n = Integer.parseInt(System.getenv("CONTEST_SLOTS"));
    long start = Long.parseLong(System.getenv("CONTEST_START_MS"));
    List<String> lines = Collections.synchronizedList(new ArrayList<>());
    List<Thread> threads = new ArrayList<>();
    for (String[] s : new String[][] {{"A", "ANARCHON_A"}, {"B", "ANARCHON_B"}}) {
      Thread t = new Thread(() -> {
        try (AnarchonClient c = AnarchonClient.connect(System.getenv(s[1]), null, Duration.ofSeconds(30))) {
          c.peers(); // connect before the start
          for (int i = 0; i < n; i++) {
            long slot = base + i;
            // Every claimer fires slot i at the same moment.
            long wait = start + i * STEP_MS - System.currentTimeMillis();
            if (wait > 0) {
              Thread.sleep(wait);
            }
            String line;
            try {
              Claim r = c.claim(job, slot);
              line = "java " + s[0] + " " + slot + " " + r.outcome() + " " + r.attempt();
              if (r.won()) {
                c.release(r, true);
              }
            } catch (AnarchonException e) {
              line = "java " + s[0] + " " + slot + " ERROR " + e.getMessage();
            }
            lines.add(line);
          }
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
      });
      threads.add(t);
      t.start();
    }
    for (Thread t : threads) {
      t.join();
    }
    for (String l : lines) {
      System.out.println(l);
    }
  }
}
