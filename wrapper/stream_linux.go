package wrapper

import (
	"errors"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-wrap/agent-wrap/journal"
	"github.com/agent-wrap/agent-wrap/rundir"
)

// streamer copies the job's log files to the wrapper's own stdout and
// stderr while those can be written. The job writes the files itself, so a
// slow or closed stream never blocks or loses its output; a write error ends
// that stream's copy, is journaled as stream_lost, and touches nothing else.
type streamer struct {
	done  chan struct{}
	wakeR *os.File // readable (EOF) once finish closes wakeW
	wakeW *os.File
	wg    sync.WaitGroup
}

func (s *supervisor) startStreams() *streamer {
	st := &streamer{done: make(chan struct{})}
	var err error
	if st.wakeR, st.wakeW, err = os.Pipe(); err != nil {
		s.warn("cannot stream the logs: %v", err)
		return nil
	}
	for _, p := range []struct {
		name, stream string
		w            io.Writer
	}{
		{rundir.StdoutFile, "stdout", s.cfg.Stdout},
		{rundir.StderrFile, "stderr", s.cfg.Stderr},
	} {
		if p.w == nil {
			continue
		}
		f, err := s.d.OpenFile(p.name, unix.O_RDONLY, 0)
		if err != nil {
			s.warn("cannot follow %s: %v", p.name, err)
			continue
		}
		st.wg.Add(1)
		go func() {
			defer st.wg.Done()
			defer f.Close()
			if err := follow(f, p.w, st.done, int(st.wakeR.Fd()), watchAfter, watchBackstop); err != nil {
				s.journal("stream_lost", journal.Fields{"stream": p.stream, "error": errText(err)}, false)
			}
		}()
	}
	return st
}

// finish tells the followers that no writer is left, and waits until each
// has copied the file to its end (or lost its stream).
func (st *streamer) finish() {
	close(st.done)
	st.wakeW.Close()
	st.wg.Wait()
	st.wakeR.Close()
}

func errText(err error) string {
	switch {
	case errors.Is(err, unix.EPIPE):
		return "broken pipe"
	case errors.Is(err, unix.EIO):
		return "input/output error (terminal hung up)"
	}
	return err.Error()
}

// How a follower learns that its file grew: a rundir.Watcher on it. Once
// its inotify watch is set up (after watchAfter: see rundir.Watcher for why
// not at once), every write(2), splice, sendfile or copy_file_range to the
// file, and a truncation, wakes it, so the timeout is only a backstop for
// what inotify cannot see (a write through a shared mapping of the file):
// long, so an idle run's follower does not wake several times a second.
// Before the watch, and where inotify cannot be had, it looks at the file
// at most every pollBackstop.
const (
	watchAfter    = rundir.WatchAfter
	watchBackstop = 10 * time.Second
	pollBackstop  = 50 * time.Millisecond
)

// follow copies f to w as it grows, until done is closed and f is read to
// its end, waking on its watcher, with a long timeout as a backstop
// (watchBackstop in a run) once the watch is set up, and at once when the
// wake descriptor becomes readable.
//
// The watch is one-shot (IN_ONESHOT) and re-armed before each copy to the
// end of the file: a write after the arm raises an event, a write before it
// is in the copy. So the job pays for one inotify event per wake-up of the
// follower, not one per write(2): with a watch in place every write makes
// the kernel allocate and merge an event, about 3% of a job that writes
// 1 GiB in 8 KiB writes (perf record -g: fsnotify's share of the job's own
// samples).
func follow(f *os.File, w io.Writer, done <-chan struct{}, wake int, watchAfter, backstop time.Duration) error {
	watch := rundir.WatchWrites(f, watchAfter)
	defer watch.Close()
	p := newPump(f, w)
	batch := time.NewTimer(10 * time.Millisecond)
	defer batch.Stop()
	final := false
	for {
		if err := p.toEOF(); err != nil {
			return err
		}
		if final {
			return nil
		}
		select {
		case <-done:
			// Every writer is gone: one more pass to the end, then stop.
			final = true
			continue
		default:
		}
		timeout := pollBackstop
		if watch.Armed() {
			timeout = backstop
		}
		if watch.WaitAlso(timeout, wake) || !watch.Armed() {
			continue // the writers are gone, or a look on a timer: no batch
		}
		// Let the writer get ahead: one wake per 10 ms copies what it
		// wrote meanwhile in large batches, instead of one read per write.
		// Once the writers are gone the final pass runs at once: the wait
		// ends early, or the run's end would wait for it.
		select {
		case <-done:
		case <-batch.C:
		}
		batch.Reset(10 * time.Millisecond)
	}
}

// pump copies a log file from its current offset to a stream. Where the
// stream is a file descriptor (a pipe or socket under ssh, a terminal,
// /dev/null) it uses sendfile(2), so the bytes never pass through the
// wrapper's memory; elsewhere, or if the kernel refuses, read and write.
type pump struct {
	f     *os.File
	w     io.Writer
	outfd int // -1: no sendfile
	buf   []byte
}

func newPump(f *os.File, w io.Writer) *pump {
	p := &pump{f: f, w: w, outfd: -1}
	if of, ok := w.(*os.File); ok {
		p.outfd = int(of.Fd()) // Fd puts it in blocking mode, as sendfile needs
	}
	return p
}

// toEOF copies until the end of the file as it is now. A write error (the
// stream is gone) is returned; the end of the file is not an error.
func (p *pump) toEOF() error {
	for p.outfd >= 0 {
		n, err := unix.Sendfile(p.outfd, int(p.f.Fd()), nil, 1<<20)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			fds := []unix.PollFd{{Fd: int32(p.outfd), Events: unix.POLLOUT}}
			_, _ = unix.Poll(fds, 1000)
			continue
		case err == unix.EINVAL || err == unix.ENOSYS || err == unix.EOPNOTSUPP:
			p.outfd = -1 // this pair cannot sendfile: fall back
		case err != nil:
			return &os.PathError{Op: "write", Path: "stream", Err: err}
		case n == 0:
			return nil
		}
	}
	if p.buf == nil {
		p.buf = make([]byte, 128<<10)
	}
	for {
		n, rerr := p.f.Read(p.buf)
		if n > 0 {
			if _, werr := p.w.Write(p.buf[:n]); werr != nil {
				return werr
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}
