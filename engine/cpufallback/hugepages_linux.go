package cpufallback

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// adviseHuge asks for huge pages on the whole 2 MiB pages within
// [p, p+n): MADV_HUGEPAGE for pages not yet touched, then MADV_COLLAPSE
// (Linux 6.1 and later) for those already are (make zeroes memory the
// heap reuses before the advice can come). It is advice: a kernel without
// transparent huge pages, or one set to "never", refuses it and the pages
// stay 4 KiB.
func adviseHuge(p unsafe.Pointer, n uintptr) {
	start := (uintptr(p) + hugePage - 1) &^ (hugePage - 1)
	end := (uintptr(p) + n) &^ (hugePage - 1)
	if end <= start {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Add(p, start-uintptr(p))), end-start)
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	_ = unix.Madvise(b, unix.MADV_COLLAPSE)
}
