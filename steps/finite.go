package steps

import "github.com/stepserve/stepserve/models"

// floatBits is how a floating-point datatype marks a value that is not
// finite: every exponent bit set (an infinity when the fraction is zero, a
// NaN otherwise).
type floatBits struct {
	size           int
	exponent, frac uint64
}

var floatDatatypes = map[models.Datatype]floatBits{
	models.FP16: {2, 0x7c00, 0x03ff},
	models.BF16: {2, 0x7f80, 0x007f},
	models.FP32: {4, 0x7f80_0000, 0x007f_ffff},
	models.FP64: {8, 0x7ff0_0000_0000_0000, 0x000f_ffff_ffff_ffff},
}

// nonFinite finds the first NaN or infinity among the packed little-endian
// elements b of a tensor of datatype dt: its element index and "NaN",
// "+Inf" or "-Inf". It reports false when there is none, and always for a
// datatype that is not floating-point.
func nonFinite(dt models.Datatype, b []byte) (int, string, bool) {
	f, ok := floatDatatypes[dt]
	if !ok {
		return 0, "", false
	}
	sign := uint64(1) << (8*f.size - 1)
	for i := 0; i+f.size <= len(b); i += f.size {
		var x uint64
		for k := f.size - 1; k >= 0; k-- {
			x = x<<8 | uint64(b[i+k])
		}
		switch {
		case x&f.exponent != f.exponent:
			continue
		case x&f.frac != 0:
			return i / f.size, "NaN", true
		case x&sign != 0:
			return i / f.size, "-Inf", true
		default:
			return i / f.size, "+Inf", true
		}
	}
	return 0, "", false
}
