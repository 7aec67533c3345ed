package runtest

import (
	"flag"
	"runtime"
	"strconv"
)

// MoreAtOnce raises how many parallel tests (t.Parallel) run at once to n,
// unless -test.parallel was given or the machine has n CPUs or more. go
// test's default is one per CPU, two on the machines this suite runs on;
// process-tree and SSH tests spend their time waiting on leases, graces,
// sshd and the processes they start, not on a CPU. Call it from TestMain,
// before m.Run.
func MoreAtOnce(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given && runtime.GOMAXPROCS(0) < n {
		_ = flag.Set("test.parallel", strconv.Itoa(n))
	}
}
