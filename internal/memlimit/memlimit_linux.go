package memlimit

import "syscall"

// addressSpaceLimit is RLIMIT_AS, 0 when unlimited (RLIM_INFINITY).
func addressSpaceLimit() int64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_AS, &r); err != nil || r.Cur > 1<<62 {
		return 0
	}
	return int64(r.Cur)
}

// physicalMemory is the machine's RAM.
func physicalMemory() int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}
