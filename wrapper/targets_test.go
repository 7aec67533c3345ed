package wrapper

import (
	"errors"
	"os"
	"sync"
	"testing"

	"github.com/agent-wrap/agent-wrap/internal/runtest"
	"github.com/agent-wrap/agent-wrap/membership"
	"github.com/agent-wrap/agent-wrap/proc"
	"github.com/agent-wrap/agent-wrap/statusfile"
)

// contains, which the wrapper's other goroutines call (a gateway asking
// per request), answers from the record published when the job started:
// nothing before that; then the job's group and the wrapper's descendants,
// and not the wrapper itself nor a process outside its tree. Called from
// many goroutines at once while the record is republished, it stays
// consistent (go test -race).
func TestContains(t *testing.T) {
	job := runtest.Spawn(t, nil, "sh", "-c", "sleep 600 & wait")
	var child proc.Stat
	runtest.Eventually(t, "the job's child", func() bool {
		all, _ := proc.Scan()
		for _, p := range all {
			if p.PPID == job.PID && !p.Dead() {
				child = p
				return true
			}
		}
		return false
	})
	boot, _ := proc.BootID()
	s := &supervisor{self: os.Getpid(), escaped: map[int]statusfile.Escaped{}}
	if _, err := s.contains(job.PID, job.Start); !errors.Is(err, membership.ErrNotMember) {
		t.Fatalf("before the job is published: %v, want ErrNotMember", err)
	}
	s.rec = statusfile.Record{RunID: "c-1", State: statusfile.Running, PID: job.PID, PGID: job.PID, SID: job.PID,
		LeaderStart: job.Start, BootID: boot, WrapperPID: s.self}
	s.publish()

	self, _ := proc.ReadStat(s.self)
	pid1, _ := proc.ReadStat(1)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 50; j++ {
				if _, err := s.contains(job.PID, job.Start); err != nil {
					t.Errorf("the leader: %v", err)
				}
				if m, err := s.contains(child.PID, child.Start); err != nil || m.Escaped {
					t.Errorf("the leader's child: %+v, %v; want a group member", m, err)
				}
				if _, err := s.contains(self.PID, self.Start); !errors.Is(err, membership.ErrNotMember) {
					t.Errorf("the wrapper itself: %v, want ErrNotMember", err)
				}
				if _, err := s.contains(1, pid1.Start); !errors.Is(err, membership.ErrNotMember) {
					t.Errorf("pid 1: %v, want ErrNotMember", err)
				}
			}
		}()
	}
	for j := 0; j < 50; j++ {
		s.rec.Escaped = append(s.rec.Escaped, statusfile.Escaped{PID: 1 << 22, Start: uint64(j)})
		s.publish()
	}
	wg.Wait()
}
