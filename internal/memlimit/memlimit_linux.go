package memlimit

import "syscall"

// addressSpaceLimit is RLIMIT_AS, 0 when unlimited (RLIM_INFINITY).
func addressSpaceLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_AS, &r); err != nil || r.Cur > 1<<62 {
		return 0
	}
	return r.Cur
}
