// Package testlog owns what tests use to read what chime logged: a
// buffer that goroutines write to while the test reads it.
package testlog

import (
	"strings"
	"sync"
)

// Buffer is an io.Writer (a slog handler's sink) safe for concurrent
// writes and reads.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
