package wire

import (
	"encoding/json"
	"fmt"
	"math"
)

// priorityParam reads Triton's priority request parameter: a non-negative
// integer, 0 (or none) for the model's default level. A level the model
// does not have takes the default too, as in Triton, however large: a
// level past what an int holds is 0 here, and the batcher maps every
// level out of range to its default.
func priorityParam(params WireParams) (int, error) {
	raw, ok := params.Get("priority")
	if !ok {
		return 0, nil
	}
	v, ok := parseInt64(raw)
	if !ok {
		var u uint64
		if err := json.Unmarshal(raw, &u); err != nil {
			return 0, fmt.Errorf("parameter priority must be a non-negative integer, got %s", excerpt(raw))
		}
		return 0, nil // above what parseInt64 reads: out of any model's range
	}
	if v < 0 {
		return 0, fmt.Errorf("parameter priority must be a non-negative integer, got %s", excerpt(raw))
	}
	if v > math.MaxInt32 {
		return 0, nil
	}
	return int(v), nil
}
