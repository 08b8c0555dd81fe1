// Command baseline is the yardstick stepserve's HTTP path is measured
// against: a plain net/http handler that decodes the same Open Inference
// Protocol JSON request with encoding/json and answers a 10-float response,
// with no model behind it. Whatever stepserve costs above it is the price of
// validation, batching, the step and the encoder.
//
//	go run ./bench/baseline -addr 127.0.0.1:9000
package main

import (
	"encoding/json"
	"flag"
	"log"
	"net/http"
)

type request struct {
	ID     string `json:"id"`
	Inputs []struct {
		Name     string    `json:"name"`
		Shape    []int64   `json:"shape"`
		Datatype string    `json:"datatype"`
		Data     []float32 `json:"data"`
	} `json:"inputs"`
}

type output struct {
	Name     string    `json:"name"`
	Datatype string    `json:"datatype"`
	Shape    []int     `json:"shape"`
	Data     []float32 `json:"data"`
}

type response struct {
	ModelName string   `json:"model_name"`
	Outputs   []output `json:"outputs"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:9000", "listen address")
	flag.Parse()
	http.HandleFunc("POST /v2/models/digits/infer", func(w http.ResponseWriter, r *http.Request) {
		var req request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Inputs) != 1 || len(req.Inputs[0].Data) < 10 {
			http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
			return
		}
		// A fixed answer of the digits model's shape: the decode and the
		// encode are what is being measured.
		out := make([]float32, 10)
		for i, v := range req.Inputs[0].Data[:10] {
			out[i] = v / 16
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(response{
			ModelName: "digits",
			Outputs:   []output{{Name: "probabilities", Datatype: "FP32", Shape: []int{1, 10}, Data: out}},
		})
	})
	log.Fatal(http.ListenAndServe(*addr, nil))
}
