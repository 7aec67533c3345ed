// Package bench measures what agent-wrap costs against what a job costs
// without it: the statistics (medians of interleaved samples), the process
// observations a measurement needs (descendants from /proc, peak RSS, exit
// through a pidfd) and the synthetic run directories the watchdog scan is
// measured over. The driver is cmd/awbench; `make bench` runs it and writes
// BENCHMARKS.md.
//
// Guarantees: every sample of a figure and of its baseline comes from the
// same run of the driver, taken in alternation (A, B, A, B ...), so a noisy
// neighbour slows both; a figure is a median, never a mean. Not guaranteed:
// that two runs of the driver agree to better than the machine's noise (this
// is a shared 2-core VM); the report says how many samples each median has
// and their spread.
package bench

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"time"
)

// Median returns the median of xs (the mean of the middle two for an even
// count), NaN for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Max returns the largest of xs, NaN for none.
func Max(xs []float64) float64 { return reduce(xs, math.Max) }

// Min returns the smallest of xs, NaN for none.
func Min(xs []float64) float64 { return reduce(xs, math.Min) }

// reduce folds xs with pick from the first on, NaN for none.
func reduce(xs []float64, pick func(a, b float64) float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	m := xs[0]
	for _, x := range xs[1:] {
		m = pick(m, x)
	}
	return m
}

// Interleave runs fns in order, one after the other, for warmup+n rounds
// (A, B, A, B ...) and returns, per fn, the samples of the last n rounds.
// The warm-up rounds fill the page cache and the dentry cache for both
// sides; their samples are dropped. The first error stops everything.
func Interleave(warmup, n int, fns ...func() (float64, error)) ([][]float64, error) {
	return interleave(warmup, n, false, fns)
}

// InterleaveRotating is Interleave with the order rotated each round (A, B,
// C; B, C, A; C, A, B ...), so that no side always runs right after the same
// other side: where one sample leaves the machine in a state that slows or
// speeds the next (a gigabyte of page cache just freed), that lands on
// every side in turn. Samples keep their round, so out[i][k] and out[j][k]
// were taken in the same round.
func InterleaveRotating(warmup, n int, fns ...func() (float64, error)) ([][]float64, error) {
	return interleave(warmup, n, true, fns)
}

func interleave(warmup, n int, rotate bool, fns []func() (float64, error)) ([][]float64, error) {
	out := make([][]float64, len(fns))
	for round := 0; round < warmup+n; round++ {
		for j := range fns {
			i := j
			if rotate {
				i = (round + j) % len(fns)
			}
			v, err := fns[i]()
			if err != nil {
				return out, fmt.Errorf("round %d, side %d: %w", round, i, err)
			}
			if round >= warmup {
				out[i] = append(out[i], v)
			}
		}
	}
	return out, nil
}

// MedianCI returns a distribution-free confidence interval of at least 95 %
// for the median of the population xs was drawn from: the order statistics
// x(k) and x(n+1-k), k the largest with P(Binomial(n, 1/2) < k) <= 2.5 %.
// With fewer than 6 samples no such k exists and the interval is the whole
// range of xs. NaN for an empty xs.
func MedianCI(xs []float64) (lo, hi float64) {
	n := len(xs)
	if n == 0 {
		return math.NaN(), math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	k, cdf, c, p := 1, 0.0, 1.0, math.Pow(0.5, float64(n)) // c = C(n, j)
	for j := 0; j < n/2; j++ {
		cdf += c * p // P(B <= j)
		if cdf > 0.025 {
			break
		}
		k = j + 1
		c = c * float64(n-j) / float64(j+1)
	}
	return s[k-1], s[n-k]
}

// ErrTimeout is returned by WaitUntil when the condition did not hold in time.
var ErrTimeout = errors.New("timed out")

// WaitUntil polls cond every interval until it returns true or an error, or
// until timeout has passed (ErrTimeout, wrapped with the last error seen).
func WaitUntil(timeout, interval time.Duration, cond func() (bool, error)) error {
	end := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if time.Now().After(end) {
			if err != nil {
				return fmt.Errorf("%w after %v: %v", ErrTimeout, timeout, err)
			}
			return fmt.Errorf("%w after %v", ErrTimeout, timeout)
		}
		time.Sleep(interval)
	}
}

// Now and Since time an operation in seconds on the monotonic clock.
func Now() time.Time { return time.Now() }

// Since returns the seconds since t0.
func Since(t0 time.Time) float64 { return time.Since(t0).Seconds() }

// Ms renders a duration in milliseconds, as the report shows times.
func Ms(d float64) string { return fmt.Sprintf("%.2f ms", d*1e3) }
