// Command gen-tiny-encoder writes the shipped model_repository/tiny-encoder: a small
// BERT-layout encoder (2 layers, hidden 128, 4 heads) with RANDOM weights
// and a small WordPiece vocabulary. It exists to demonstrate shapes, text
// requests, two-dimensional buckets and speed; its embeddings mean nothing.
// The output is the same on every run (fixed seed).
//
//	go run ./cmd/gen-tiny-encoder -out model_repository/tiny-encoder
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
)

const (
	vocabSize    = 1024
	hidden       = 128
	layers       = 2
	intermediate = 512
	maxPosition  = 128
	seed         = 20261130
)

// words is the whole-word part of the vocabulary: common English words, so
// that typical sentences tokenize into real pieces rather than [UNK].
const words = `the of and to a in is it you that he was for on are with as i his they be at one have this from or had by
not word but what some we can out other were all there when up use your how said an each she which do their time if will
way about many then them write would like so these her long make thing see him two has look more day could go come did number
sound no most people my over know water than call first who may down side been now find any new work part take get place made
live where after back little only round man year came show every good me give our under name very through just form sentence
great think say help low line differ turn cause much mean before move right boy old too same tell does set three want air well
also play small end put home read hand port large spell add even land here must big high such follow act why ask men change went
light kind off need house picture try us again animal point mother world near build self earth father head stand own page should
country found answer school grow study still learn plant cover food sun four between state keep eye never last let thought city
tree cross farm hard start might story saw far sea draw left late run while press close night real life few north open seem
together next white children begin got walk example ease paper group always music those both mark often letter until mile river
car feet care second book carry took science eat room friend began idea fish mountain stop once base hear horse cut sure watch
color face wood main enough plain girl usual young ready above ever red list though feel talk bird soon body dog family direct
pose leave song measure door product black short numeral class wind question happen complete ship area half rock order fire south
problem piece told knew pass since top whole king space heard best hour better true during hundred five remember step early hold
west ground interest reach fast verb sing listen six table travel less morning ten simple several vowel toward war lay against
pattern slow center love person money serve appear road map rain rule govern pull cold notice voice unit power town fine certain
fly fall lead cry dark machine note wait plan figure star box noun field rest correct able pound done beauty drive stood contain
front teach week final gave green oh quick develop ocean warm free minute strong special mind behind clear tail produce fact street
inch multiply nothing course stay wheel full force blue object decide surface deep moon island foot system busy test record boat
common gold possible plane stead dry wonder laugh thousand ago ran check game shape equate hot miss brought heat snow tire bring yes
distant fill east paint language among model serving device step graph bucket batch token text embedding search query document`

var suffixes = []string{"s", "es", "ed", "ing", "er", "est", "ly", "ion", "ment", "ness", "able", "ful"}

func main() {
	out := flag.String("out", "model_repository/tiny-encoder", "model directory to write")
	flag.Parse()
	if err := write(*out); err != nil {
		fmt.Fprintln(os.Stderr, "gen-tiny-encoder:", err)
		os.Exit(1)
	}
}

func vocabulary() []string {
	v := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
	seen := map[string]bool{}
	add := func(t string) {
		if !seen[t] && len(v) < vocabSize {
			seen[t] = true
			v = append(v, t)
		}
	}
	for c := '!'; c <= '~'; c++ {
		if !(c >= 'A' && c <= 'Z') {
			add(string(c))
		}
	}
	for c := 'a'; c <= 'z'; c++ {
		add("##" + string(c))
	}
	for c := '0'; c <= '9'; c++ {
		add("##" + string(c))
	}
	for _, s := range suffixes {
		add("##" + s)
	}
	for _, w := range strings.Fields(words) {
		add(w)
	}
	for i := 0; len(v) < vocabSize; i++ {
		add(fmt.Sprintf("[unused%d]", i))
	}
	return v
}

func write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, models.VocabFile))
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, t := range vocabulary() {
		fmt.Fprintln(w, t)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}

	rw := randweights.New(seed, seed)
	rw.Encoder("", randweights.Encoder{Vocab: vocabSize, Positions: maxPosition, Types: 2, Hidden: hidden, Intermediate: intermediate, Layers: layers})
	return rw.Write(filepath.Join(dir, models.WeightsFile),
		map[string]string{"format": "pt", "generator": "cmd/gen-tiny-encoder", "seed": fmt.Sprint(seed), "weights": "random"})
}
