package wire

import "github.com/stepserve/stepserve/models"

// A Footprint is what a request will hold in memory until its response is
// written, bounded from its declared shapes before any of it is built.
type Footprint struct {
	Rows    int   // the request's
	inputs  int64 // the decoded tensors
	step    int64 // what the model builds for the step from them
	Outputs int64 // the output buffers
	JSON    int64 // the response's JSON (for gRPC: the whole encoded response)
	Binary  int64 // the binary outputs written after the JSON (the output buffers themselves)
	classes int64 // binary classification outputs, built for the response
	scratch int64 // what building the response takes besides (classification's ranking)
	// Protobuf says the response is gRPC's: json is then its encoding,
	// raw outputs included, and binary is zero.
	Protobuf bool
}

// Memory is what the request will take beyond its body.
func (f Footprint) Memory() int64 {
	return f.inputs + f.step + f.Outputs + f.JSON + f.classes + f.scratch
}

// Response is the size of the response.
func (f Footprint) Response() int64 { return f.JSON + f.Binary + f.classes }

// FootprintOf bounds what a parsed request will cost, given the bytes its
// inputs take decoded and the longest sequence they declare (0: none): the
// model's step inputs and every output at the longest sequence the request
// may take, and its response at the longest JSON each value may take.
func FootprintOf(m *models.Model, req *InferRequest, inputs int64, seq int) Footprint {
	cfg := m.Config
	f := Footprint{Rows: req.Rows, inputs: inputs}
	if seq == 0 {
		seq = cfg.MaxSeq() // text: its tokens may be as long as the longest bucket
	}
	rows := int64(req.Rows)
	f.step = m.StepBytes(req.Rows, seq)
	// The JSON around the values: names, shapes and punctuation; an id may
	// be escaped six bytes to one.
	f.JSON = 64 + int64(len(m.Name)+len(m.Version)+6*len(req.ID))
	for i, o := range cfg.Outputs {
		rowBytes := rows * int64(o.RowBytes(seq))
		f.Outputs += rowBytes
		for _, c := range req.Outputs {
			switch {
			case c.Index != i:
			case c.SharedMemory != nil:
				// Its metadata and the region's parameters; the data goes
				// to the region.
				f.JSON += 112 + int64(len(o.Name)+21*len(o.Shape)) + shmParamsJSON + 2*int64(len(c.SharedMemory.Region))
			case c.Classes > 0:
				f.JSON += 112 + int64(len(o.Name)+21*2)
				var labels []string
				if i < len(m.Labels) {
					labels = m.Labels[i]
				}
				f.scratch = max(f.scratch, classScratch(o)) // one output at a time
				strs := rows * int64(c.Classes) * classElementBytes(o.Datatype, o.RowElements(seq), labels, !c.Binary)
				if c.Binary {
					f.classes += strs
				} else {
					f.JSON += strs
				}
			case c.Binary:
				f.JSON += 112 + int64(len(o.Name)+21*len(o.Shape))
				f.Binary += rowBytes
			default:
				f.JSON += 112 + int64(len(o.Name)+21*len(o.Shape)) + rows*int64(o.RowElements(seq)*jsonValueBytes(o.Datatype))
			}
		}
	}
	return f
}
