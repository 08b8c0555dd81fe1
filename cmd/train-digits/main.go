// Command train-digits trains the shipped digits model: an MLP 64 -> 128 ->
// 10 (relu, softmax) on the UCI optical digits, reproducibly (fixed seed,
// stratified 75/25 split), and writes model_repository/digits/weights.safetensors and
// the held-out rows the end-to-end test classifies.
//
// The model takes raw pixel values (0..16). Training scales them to 0..1;
// the scale is folded into the first layer's weights on export, so serving
// needs no preprocessing.
//
//	go run ./cmd/train-digits -data data/digits.csv.gz
package main

import (
	"bufio"
	"compress/gzip"
	"encoding/csv"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"

	"github.com/stepserve/stepserve/models"
)

const (
	nIn, nHidden, nOut = 64, 128, 10
	pixelScale         = 16.0
)

type sample struct {
	x     [nIn]float64
	label int
}

func main() {
	data := flag.String("data", "data/digits.csv.gz", "digits CSV (gzip): 64 pixels then the label per row")
	weights := flag.String("weights", "model_repository/digits/weights.safetensors", "where to write the weights")
	heldout := flag.String("heldout", "cmd/serve/testdata/digits-heldout.csv", "where to write the held-out rows")
	seed := flag.Uint64("seed", 20261130, "random seed for the split, the initial weights and the shuffles")
	epochs := flag.Int("epochs", 80, "training epochs")
	flag.Parse()
	if err := train(*data, *weights, *heldout, *seed, *epochs); err != nil {
		fmt.Fprintln(os.Stderr, "train-digits:", err)
		os.Exit(1)
	}
}

func train(dataPath, weightsPath, heldoutPath string, seed uint64, epochs int) error {
	all, err := readDigits(dataPath)
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	trainSet, testSet := stratifiedSplit(all, 0.25, rng)

	net := newMLP(rng)
	opt := newAdam(net, 1e-3)
	const batch = 32
	for epoch := range epochs {
		rng.Shuffle(len(trainSet), func(i, j int) { trainSet[i], trainSet[j] = trainSet[j], trainSet[i] })
		var loss float64
		for i := 0; i < len(trainSet); i += batch {
			loss += net.step(trainSet[i:min(i+batch, len(trainSet))], opt)
		}
		if epoch%20 == 19 || epoch == epochs-1 {
			fmt.Printf("epoch %d: train loss %.4f\n", epoch+1, loss/float64(len(trainSet)))
		}
	}

	tensors := net.export()
	f, err := os.Create(weightsPath)
	if err != nil {
		return err
	}
	meta := map[string]string{
		"format":  "pt",
		"trainer": "cmd/train-digits",
		"seed":    strconv.FormatUint(seed, 10),
		"epochs":  strconv.Itoa(epochs),
	}
	if err := models.WriteSafetensors(f, tensors, meta); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}

	// Check the exported (float32, raw-pixel) weights, as the server runs them.
	correct := 0
	for _, s := range testSet {
		if argmax(forwardExported(tensors, s.x)) == s.label {
			correct++
		}
	}
	fmt.Printf("train %d rows, held-out %d rows, held-out accuracy %.4f\n",
		len(trainSet), len(testSet), float64(correct)/float64(len(testSet)))
	return writeHeldout(heldoutPath, testSet)
}

func readDigits(path string) ([]sample, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	recs, err := csv.NewReader(gz).ReadAll()
	if err != nil {
		return nil, err
	}
	out := make([]sample, len(recs))
	for i, rec := range recs {
		if len(rec) != nIn+1 {
			return nil, fmt.Errorf("%s: row %d has %d fields, want %d", path, i+1, len(rec), nIn+1)
		}
		for j := range nIn {
			v, err := strconv.ParseFloat(rec[j], 64)
			if err != nil {
				return nil, fmt.Errorf("%s: row %d: %w", path, i+1, err)
			}
			out[i].x[j] = v
		}
		if out[i].label, err = strconv.Atoi(rec[nIn]); err != nil || out[i].label < 0 || out[i].label >= nOut {
			return nil, fmt.Errorf("%s: row %d: bad label %q", path, i+1, rec[nIn])
		}
	}
	return out, nil
}

// stratifiedSplit holds out frac of every class.
func stratifiedSplit(all []sample, frac float64, rng *rand.Rand) (train, test []sample) {
	byClass := make([][]sample, nOut)
	for _, s := range all {
		byClass[s.label] = append(byClass[s.label], s)
	}
	for _, c := range byClass {
		rng.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
		n := int(math.Round(frac * float64(len(c))))
		test = append(test, c[:n]...)
		train = append(train, c[n:]...)
	}
	return train, test
}

func writeHeldout(path string, rows []sample) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "# Held-out rows of the UCI optical digits (CC BY 4.0, Alpaydin & Kaynak 1998), written by cmd/train-digits: 64 pixels, then the label.")
	for _, s := range rows {
		parts := make([]string, 0, nIn+1)
		for _, v := range s.x {
			parts = append(parts, strconv.Itoa(int(v)))
		}
		parts = append(parts, strconv.Itoa(s.label))
		fmt.Fprintln(w, strings.Join(parts, ","))
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func argmax(v []float64) int {
	best := 0
	for i := range v {
		if v[i] > v[best] {
			best = i
		}
	}
	return best
}
