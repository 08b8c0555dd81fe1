//go:build !linux

package cpufallback

import "unsafe"

func adviseHuge(unsafe.Pointer, uintptr) {}
