package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"unsafe"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
)

// decodeJSONData writes the values of a JSON "data" array (flat or nested,
// row-major) into dst as packed elements of type dt, and returns how many it
// wrote. The bytes are already known to be valid JSON. It never writes past
// dst: a value beyond its capacity is an error, so a body cannot make the
// server write more than the declared shape.
// Nesting deeper than the shape's rank is refused, so that a hostile body
// of brackets costs nothing.
func decodeJSONData(raw []byte, dt models.Datatype, dst []byte, rank int) (int, error) {
	size := dt.Size()
	if size == 0 || dt == models.FP16 || dt == models.BF16 {
		return 0, fmt.Errorf("%s data must be sent as binary tensor data", dt)
	}
	capacity := len(dst) / size
	i, n := 0, 0
	for i < len(raw) && isSpace(raw[i]) {
		i++
	}
	if i == len(raw) || raw[i] != '[' {
		return 0, fmt.Errorf("data must be an array of %s values", dt)
	}
	depth := 0
	for i < len(raw) {
		c := raw[i]
		switch {
		case c == '[':
			if depth++; depth > rank {
				return n, fmt.Errorf("data is nested deeper than its shape's %d dimensions", rank)
			}
			i++
			continue
		case c == ']':
			depth--
			i++
			continue
		case c == ',' || isSpace(c):
			i++
			continue
		case c == '"':
			return n, fmt.Errorf("element %d is a string; want %s numbers", n, dt)
		case c == '{':
			return n, fmt.Errorf("element %d is an object; want %s numbers", n, dt)
		case c == 'n':
			return n, fmt.Errorf("element %d is null; want %s numbers", n, dt)
		}
		j := i
		for j < len(raw) && !isDelim(raw[j]) {
			j++
		}
		tok := raw[i:j]
		i = j
		if n == capacity {
			return n + 1, fmt.Errorf("more values than the shape holds (%d)", capacity)
		}
		if err := putValue(dst[n*size:], dt, tok); err != nil {
			return n, fmt.Errorf("element %d: %w", n, err)
		}
		n++
	}
	return n, nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func isDelim(c byte) bool { return c == ',' || c == ']' || c == '[' || isSpace(c) }

// putValue parses one JSON scalar as dt and stores it little-endian.
func putValue(dst []byte, dt models.Datatype, tok []byte) error {
	s := unsafe.String(unsafe.SliceData(tok), len(tok)) // parsed only, never kept
	if dt == models.BOOL {
		switch s {
		case "true":
			dst[0] = 1
		case "false":
			dst[0] = 0
		default:
			return fmt.Errorf("%s is not a boolean; want true or false", strconv.Quote(s))
		}
		return nil
	}
	if s == "true" || s == "false" {
		return fmt.Errorf("%s is a boolean; want a %s number", s, dt)
	}
	switch dt {
	case models.FP32:
		f, err := strconv.ParseFloat(s, 32)
		if err != nil || math.IsInf(f, 0) {
			return fmt.Errorf("%s is not a finite FP32 value", s)
		}
		binary.LittleEndian.PutUint32(dst, math.Float32bits(float32(f)))
	case models.FP64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsInf(f, 0) {
			return fmt.Errorf("%s is not a finite FP64 value", s)
		}
		binary.LittleEndian.PutUint64(dst, math.Float64bits(f))
	case models.INT8, models.INT16, models.INT32, models.INT64:
		bits := 8 * dt.Size()
		v, err := strconv.ParseInt(s, 10, bits)
		if err != nil {
			return fmt.Errorf("%s is not an integer in the %s range", s, dt)
		}
		PutInt(dst, uint64(v), dt.Size())
	case models.UINT8, models.UINT16, models.UINT32, models.UINT64:
		bits := 8 * dt.Size()
		v, err := strconv.ParseUint(s, 10, bits)
		if err != nil {
			return fmt.Errorf("%s is not an integer in the %s range", s, dt)
		}
		PutInt(dst, v, dt.Size())
	default:
		return fmt.Errorf("datatype %s cannot be sent as JSON", dt)
	}
	return nil
}

func PutInt(dst []byte, v uint64, size int) {
	switch size {
	case 1:
		dst[0] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(dst, uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(dst, uint32(v))
	case 8:
		binary.LittleEndian.PutUint64(dst, v)
	}
}

// checkFinite reports the first NaN or infinity in a packed float tensor.
func checkFinite(data []byte, dt models.Datatype) error {
	switch dt {
	case models.FP32:
		// An infinity or a NaN has every exponent bit set: tested on the
		// bits, two elements a load, without converting.
		const exp = 0x7f800000
		i := 0
		for ; i+8 <= len(data); i += 8 {
			u := binary.LittleEndian.Uint64(data[i:])
			if uint32(u)&exp == exp || uint32(u>>32)&exp == exp {
				break
			}
		}
		for ; i+4 <= len(data); i += 4 {
			if bits := binary.LittleEndian.Uint32(data[i:]); bits&exp == exp {
				return fmt.Errorf("element %d is %v; values must be finite", i/4, math.Float32frombits(bits))
			}
		}
	case models.FP64:
		const exp = 0x7ff0000000000000
		for i := 0; i+8 <= len(data); i += 8 {
			if bits := binary.LittleEndian.Uint64(data[i:]); bits&exp == exp {
				return fmt.Errorf("element %d is %v; values must be finite", i/8, math.Float64frombits(bits))
			}
		}
	case models.FP16:
		for i := 0; i+2 <= len(data); i += 2 {
			if binary.LittleEndian.Uint16(data[i:])&0x7c00 == 0x7c00 {
				return fmt.Errorf("element %d is not finite; values must be finite", i/2)
			}
		}
	case models.BF16:
		for i := 0; i+2 <= len(data); i += 2 {
			if binary.LittleEndian.Uint16(data[i:])&0x7f80 == 0x7f80 {
				return fmt.Errorf("element %d is not finite; values must be finite", i/2)
			}
		}
	}
	return nil
}

// jsonValueBytes is the most bytes appendJSONData writes for one value of
// dt, with its comma: the longest shortest-form float ("-1.2345678e-38" for
// FP32), integer or boolean.
func jsonValueBytes(dt models.Datatype) int {
	switch dt {
	case models.FP32:
		return 16
	case models.INT32:
		return 12
	case models.INT64:
		return 21
	case models.BOOL:
		return 6
	case models.INT8, models.UINT8:
		return 5
	case models.INT16, models.UINT16:
		return 7
	case models.UINT32:
		return 11
	case models.UINT64:
		return 21
	}
	return 25 // FP64: "-1.2345678901234567e-308"
}

// AppendJSONData appends a packed tensor as a flat JSON array. Non-finite
// float values (which a model should never produce) are an error rather
// than invalid JSON.
func AppendJSONData(b []byte, data []byte, dt models.Datatype) ([]byte, error) {
	b = append(b, '[')
	size := dt.Size()
	for i := 0; i+size <= len(data); i += size {
		if i > 0 {
			b = append(b, ',')
		}
		switch dt {
		case models.FP32:
			f := math.Float32frombits(binary.LittleEndian.Uint32(data[i:]))
			if f != f || math.IsInf(float64(f), 0) {
				return b, fmt.Errorf("element %d is %v", i/size, f)
			}
			b = strconv.AppendFloat(b, float64(f), 'g', -1, 32)
		case models.FP64:
			f := math.Float64frombits(binary.LittleEndian.Uint64(data[i:]))
			if math.IsNaN(f) || math.IsInf(f, 0) {
				return b, fmt.Errorf("element %d is %v", i/size, f)
			}
			b = strconv.AppendFloat(b, f, 'g', -1, 64)
		case models.INT64:
			b = strconv.AppendInt(b, int64(binary.LittleEndian.Uint64(data[i:])), 10)
		case models.INT32:
			b = strconv.AppendInt(b, int64(int32(binary.LittleEndian.Uint32(data[i:]))), 10)
		case models.BOOL:
			b = strconv.AppendBool(b, data[i] != 0)
		case models.INT8:
			b = strconv.AppendInt(b, int64(int8(data[i])), 10)
		case models.UINT8:
			b = strconv.AppendUint(b, uint64(data[i]), 10)
		case models.INT16:
			b = strconv.AppendInt(b, int64(int16(binary.LittleEndian.Uint16(data[i:]))), 10)
		case models.UINT16:
			b = strconv.AppendUint(b, uint64(binary.LittleEndian.Uint16(data[i:])), 10)
		case models.UINT32:
			b = strconv.AppendUint(b, uint64(binary.LittleEndian.Uint32(data[i:])), 10)
		case models.UINT64:
			b = strconv.AppendUint(b, binary.LittleEndian.Uint64(data[i:]), 10)
		default:
			return b, fmt.Errorf("datatype %s cannot be returned as JSON; request it as binary data", dt)
		}
	}
	return append(b, ']'), nil
}

// maxFloat16 is float16's largest finite value.
const maxFloat16 = 65504

// FitFloat16 checks the request's FP32, FP64 and BF16 inputs against float16's
// range, for a model whose engine computes in float16: staging would make
// a finite value beyond ±65504 infinite. They are refused (400 naming the
// input, the element and the range) or, where the model's
// float16_overflow says clamp, clamped to ±65504.
func (req *InferRequest) FitFloat16(m *models.Model) error {
	clamp := m.Config.Float16Overflow == "clamp"
	for i := range req.Inputs {
		t := &req.Inputs[i]
		spec := m.Config.Inputs[i]
		var width int
		switch spec.Datatype {
		case models.FP32:
			width = 4
		case models.FP64:
			width = 8
		case models.BF16:
			width = 2
		default:
			continue
		}
		for j := 0; j+width <= len(t.Data); j += width {
			var v float64
			switch width {
			case 2:
				v = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(t.Data[j:])) << 16))
			case 4:
				v = float64(math.Float32frombits(binary.LittleEndian.Uint32(t.Data[j:])))
			default:
				v = math.Float64frombits(binary.LittleEndian.Uint64(t.Data[j:]))
			}
			if v <= maxFloat16 && v >= -maxFloat16 {
				continue
			}
			if !clamp {
				return apierr.BadRequest(fmt.Sprintf("input %q: element %d is %g, outside the range float16 holds (±65504); model %s computes in float16 (device_dtype) and would see it as infinite: send values within ±65504, or set float16_overflow: clamp in its model.yaml",
					spec.Name, j/width, v, m.Name))
			}
			v = math.Copysign(maxFloat16, v)
			switch width {
			case 2:
				// 65504 is not a bfloat16: the largest bfloat16 below it.
				binary.LittleEndian.PutUint16(t.Data[j:], uint16(math.Float32bits(float32(math.Copysign(65280, v)))>>16))
			case 4:
				binary.LittleEndian.PutUint32(t.Data[j:], math.Float32bits(float32(v)))
			default:
				binary.LittleEndian.PutUint64(t.Data[j:], math.Float64bits(v))
			}
		}
	}
	return nil
}
