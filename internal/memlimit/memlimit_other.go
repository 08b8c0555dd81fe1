//go:build !linux

package memlimit

func addressSpaceLimit() int64 { return 0 }

func physicalMemory() int64 { return 0 }
