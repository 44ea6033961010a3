// Command contest is the Go claimer of the clients' contest (run by
// clients/test.sh): one goroutine per sidecar claims slot i of
// CONTEST_JOB at CONTEST_START_MS + 30 ms * i, prints one line per claim
// ("go <sidecar> <slot> <OUTCOME> <attempt>") and releases what it won.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	anarchon "github.com/anarchon/anarchon/clients/go"
)

const stepMs = 30

func envInt(name string) int64 {
	v, err := strconv.ParseInt(os.Getenv(name), 10, 64)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	return v
}

func main() {
	job := os.Getenv("CONTEST_JOB")
	base, n, start := envInt("CONTEST_BASE"), envInt("CONTEST_SLOTS"), envInt("CONTEST_START_MS")
	var mu sync.Mutex
	var lines []string
	var wg sync.WaitGroup
	for _, s := range []struct{ name, env string }{{"A", "ANARCHON_A"}, {"B", "ANARCHON_B"}} {
		s := s
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := anarchon.Dial(os.Getenv(s.env))
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			defer c.Close()
			ctx := context.Background()
			c.Peers(ctx) // connect before the start
			for i := int64(0); i < n; i++ {
				slot := base + i
				// Every claimer fires slot i at the same moment.
				time.Sleep(time.Until(time.UnixMilli(start + i*stepMs)))
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				r, err := c.Claim(cctx, job, slot)
				var line string
				if err != nil {
					line = fmt.Sprintf("go %s %d ERROR %v", s.name, slot, err)
				} else {
					line = fmt.Sprintf("go %s %d %s %d", s.name, slot, r.Outcome, r.Attempt)
					if r.Won() {
						if err := c.Release(cctx, job, slot, r.Token, true); err != nil {
							line = fmt.Sprintf("go %s %d ERROR release: %v", s.name, slot, err)
						}
					}
				}
				cancel()
				mu.Lock()
				lines = append(lines, line)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, l := range lines {
		fmt.Println(l)
	}
}
