//go:build darwin || freebsd

package proc

// bsdState maps a BSD p_stat/ki_stat (SIDL 1, SRUN 2, SSLEEP 3, SSTOP 4,
// SZOMB 5, and on FreeBSD SWAIT 6, SLOCK 7) to the letter Stat.State uses
// on Linux, so Dead means the same everywhere.
func bsdState(s int) byte {
	switch s {
	case 1:
		return 'I'
	case 2:
		return 'R'
	case 3, 6, 7:
		return 'S'
	case 4:
		return 'T'
	case 5:
		return 'Z'
	}
	return '?'
}
