package bucketing

import (
	"errors"
	"fmt"
)

// The limits of a model's bucket lists.
const (
	maxBatchSize = 1 << 16
	// seqMultiple: the NPU's fused attention kernel needs query lengths in
	// multiples of 32.
	seqMultiple = 32
)

// ValidateBatch checks a model's batch sizes: at least one, each in
// 1..65536, strictly increasing. Its error names the list as model.yaml
// spells it (buckets.batch) and what is accepted; the caller says where the
// list came from.
func ValidateBatch(sizes []int) error {
	if len(sizes) == 0 {
		return errors.New("buckets.batch: is required; list the batch sizes to compile, e.g. [1, 4, 16, 32]")
	}
	for i, b := range sizes {
		if b <= 0 || b > maxBatchSize {
			return fmt.Errorf("buckets.batch: %d is not a valid batch size; want 1..%d", b, maxBatchSize)
		}
		if i > 0 && b <= sizes[i-1] {
			return fmt.Errorf("buckets.batch: %v must be strictly increasing", sizes)
		}
	}
	return nil
}

// ValidateSeq checks a model's sequence lengths: none (a model without a
// sequence dimension), or positive multiples of 32, strictly increasing.
// Whether a model needs them is the model's business, not this check's.
// Its error names the list as model.yaml spells it (buckets.seq).
func ValidateSeq(seqs []int) error {
	for i, n := range seqs {
		if n <= 0 || n%seqMultiple != 0 {
			return fmt.Errorf("buckets.seq: %d is not a multiple of %d: the NPU's fused attention kernel needs query lengths in multiples of %[2]d (execution semantics, alignment rules); use e.g. [32, 64, 128]", n, seqMultiple)
		}
		if i > 0 && n <= seqs[i-1] {
			return fmt.Errorf("buckets.seq: %v must be strictly increasing", seqs)
		}
	}
	return nil
}
