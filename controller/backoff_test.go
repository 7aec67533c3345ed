package controller

import (
	"context"
	"testing"
	"time"
)

func TestBackoffFirstRetryAtOnce(t *testing.T) {
	var b backoff
	t0 := time.Now()
	b.wait(context.Background())
	if d := time.Since(t0); d > 50*time.Millisecond {
		t.Errorf("first wait took %v, want at once", d)
	}
	t0 = time.Now()
	b.wait(context.Background())
	if d := time.Since(t0); d < backoffMin {
		t.Errorf("second wait took %v, want at least %v", d, backoffMin)
	}
	b.reset()
	t0 = time.Now()
	b.wait(context.Background())
	if d := time.Since(t0); d > 50*time.Millisecond {
		t.Errorf("first wait after reset took %v, want at once", d)
	}
}
