package testsvc

import (
	"bytes"
	"sync"
)

// Output is a bytes.Buffer safe for one writer and many readers: the
// output of a process a test runs (its Stdout or Stderr), read while the
// process writes it.
type Output struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

// String returns everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}
