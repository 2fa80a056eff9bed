package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// profiler fetches CPU profiles of a fleet's replicas from their
// /debug/pprof (CHIME_PPROF_ADDR): each start takes one of every replica,
// seconds long, in the background, into dir/<prefix>-<phase>-<replica>.pprof.
// Without a dir it does nothing.
type profiler struct {
	ctx     context.Context
	f       *fleet
	dir     string
	seconds int
	prefix  string

	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

func (f *fleet) profiler(ctx context.Context, dir string, seconds int, prefix string) *profiler {
	return &profiler{ctx: ctx, f: f, dir: dir, seconds: seconds, prefix: prefix}
}

func (p *profiler) start(phase string) {
	if p.dir == "" {
		return
	}
	for _, r := range p.f.replicas {
		path := filepath.Join(p.dir, fmt.Sprintf("%s-%s-%s.pprof", p.prefix, phase, r.id))
		p.wg.Go(func() {
			if err := fetchProfile(p.ctx, r.pprofAddr, p.seconds, path); err != nil {
				p.mu.Lock()
				p.errs = append(p.errs, err)
				p.mu.Unlock()
				return
			}
			p.f.progress("profile %s", path)
		})
	}
}

// wait returns once every profile started is written, with their errors.
func (p *profiler) wait() error {
	p.wg.Wait()
	return errors.Join(p.errs...)
}

func fetchProfile(ctx context.Context, addr string, seconds int, path string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(seconds)*time.Second+10*time.Second)
	defer cancel()
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, seconds)
	if err := fetchTo(ctx, http.DefaultClient, url, path); err != nil {
		return fmt.Errorf("bench: profile %s: %w", addr, err)
	}
	return nil
}

// fetchTo writes the body of a GET of url to path.
func fetchTo(ctx context.Context, c *http.Client, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	res, err := c.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, res.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, res.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
