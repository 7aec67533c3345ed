// Package membership answers one question for every part of agent-wrap:
// which live processes are run X's, and is this process one of them. The
// wrapper asks it for the targets of a stop, cancel and the watchdog before
// they signal, reconcile for its evidence, and a gateway (the SSH agent
// relay, authorize) for each request.
//
// The answer is judged from the run's record, never from a name:
//
//   - the record must be from this boot (boot_id); a PID from an earlier
//     boot means nothing (Check);
//   - a process in the run's own cgroup (status.json `cgroup`, which must be a
//     run cgroup, see cgroup.Valid) is the run's: nothing else is ever put
//     there and nothing leaves it by forking;
//   - a group member has the recorded PGID and SID and did not start before
//     the leader (leader_start); when the process now at the leader's PID has
//     another start time the group number was recycled, and no group member
//     is the run's; with a cgroup, a group member outside it is not the run's
//     either (it is reported as rejected);
//   - a recorded escape (status.json `escaped`) is the run's while the
//     process at its PID has the recorded start time;
//   - without a cgroup, a process forked below a member is the run's (a
//     PPID always names the live parent), and so is one below the run's
//     wrapper while it lives with its recorded start time: as subreaper it
//     holds every orphan of the job. A stop from outside so finds an escape
//     the wrapper did not record because it was stopped or slow;
//   - without a cgroup, from outside (Run.Logs), a process that started no
//     earlier than the wrapper and holds the run's stdout.log or stderr.log
//     (the files, by device and inode) as its fd 1 or 2 is the run's: the
//     wrapper opens them for the job alone, so the holder is the job or was
//     started below it, even after its wrapper and every parent in between
//     died and left it to init;
//   - only for the run's own wrapper (Run.Supervisor): the leader is its
//     unreaped child, so the group number cannot be recycled and a group
//     member counts wherever it is, and every descendant of the wrapper, its
//     subreaper, is the run's (an escape not recorded yet).
//
// A zombie is never a member: it runs nothing. A member is identified by its
// PID and start time (Member.Identity), so a caller that signals it later
// through stop.Signal can never hit a recycled PID.
//
// What is not guaranteed: without a cgroup, one case stays undecidable from
// outside. The whole group died, its number was reused by a new session
// whose leader has also exited; its members then pass every check. That
// needs a PID reuse and a second session leader's exit between two looks,
// and is why the cgroup boundary is preferred where the host has one.
//
// The package reads /proc, /sys/fs/cgroup and run directories; it never
// signals, and never writes.
package membership
