package chaos

// Shrink cuts a failing schedule to a shorter one that still fails: first
// whole runs (with their faults), then faults, each by halves, then quarters,
// down to one at a time (delta debugging). fails replays a candidate and
// reports whether it fails the same way; it is called at most budget times
// (each call plays a schedule, seconds of real time). The result is the
// smallest failing schedule found, s itself if no cut failed.
func Shrink(s Schedule, fails func(Schedule) bool, budget int) Schedule {
	calls := 0
	try := func(c Schedule) bool {
		if calls >= budget {
			return false
		}
		calls++
		return fails(c)
	}
	// Runs first: a run cut takes its faults with it.
	runs := make([]int, 0, len(s.Runs))
	for _, r := range s.Runs {
		runs = append(runs, r.Index)
	}
	runs = ddmin(runs, func(keep []int) bool {
		m := map[int]bool{}
		for _, i := range keep {
			m[i] = true
		}
		return try(s.OnlyRuns(m))
	})
	m := map[int]bool{}
	for _, i := range runs {
		m[i] = true
	}
	s = s.OnlyRuns(m)
	// Then faults.
	idx := make([]int, len(s.Steps))
	for i := range idx {
		idx[i] = i
	}
	idx = ddmin(idx, func(keep []int) bool { return try(keepSteps(s, keep)) })
	return keepSteps(s, idx)
}

func keepSteps(s Schedule, keep []int) Schedule {
	k := map[int]bool{}
	for _, i := range keep {
		k[i] = true
	}
	drop := map[int]bool{}
	for i := range s.Steps {
		if !k[i] {
			drop[i] = true
		}
	}
	return s.Without(drop)
}

// ddmin is Zeller's delta debugging over a list of items: the returned
// subset still makes fails true, and removing any one chunk of the last
// granularity tried does not (as far as the budget allowed). fails(xs) is
// assumed true on entry.
func ddmin(xs []int, fails func([]int) bool) []int {
	n := 2
	for len(xs) >= 2 {
		chunk := (len(xs) + n - 1) / n
		cut := false
		for start := 0; start < len(xs); start += chunk {
			end := min(start+chunk, len(xs))
			rest := append(append([]int{}, xs[:start]...), xs[end:]...)
			if len(rest) > 0 && fails(rest) {
				xs = rest
				n = max(n-1, 2)
				cut = true
				break
			}
		}
		if !cut {
			if n >= len(xs) {
				break
			}
			n = min(2*n, len(xs))
		}
	}
	// The empty list is never tried: a run or fault that fails alone is
	// as small as it gets.
	return xs
}
