package test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	eppmetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/backend/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	extractormetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/extractor/metrics"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/fairness"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/ordering"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/usagelimits"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requesthandling/parsers/openai"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/picker"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/profile"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/kvcacheutilization"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/prefix"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/queuedepth"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"
)

// The default profile's scorer weights in GAIE v1.5.0
// (pkg/epp/config/loader/defaults.go), printed with the table; the picker
// takes them from GAIE's loader, and the functional test holds the two to
// each other.
const (
	queueScorerWeight   = 2
	kvCacheScorerWeight = 2
	prefixScorerWeight  = 3
	// eppRefresh is how often EPP's metrics refresh reads each model
	// server (its --refresh-metrics-interval default).
	eppRefresh = 50 * time.Millisecond
)

// router sends each request to one server of a pool, by index.
type router interface {
	route(ctx context.Context, id string, body []byte) (int, error)
}

// roundRobin is the baseline: the next server, whatever it holds.
type roundRobin struct {
	n    int
	next atomic.Uint64
}

func (r *roundRobin) route(context.Context, string, []byte) (int, error) {
	return int((r.next.Add(1) - 1) % uint64(r.n)), nil
}

// gaiePicker routes as EPP's request director does, with GAIE's own code
// for every decision: the OpenAI parser reads the body, the approximate
// prefix-cache producer matches its prefix against what was routed before
// (PrepareData), the scheduler runs the default profile over the pool's
// last scraped metrics (Schedule), and the producer records where it went
// (PreRequest). What it leaves out is the director's plumbing around those
// calls: the datastore fed by Kubernetes informers, InferenceObjective
// lookups, admission and the Envoy ext_proc request context.
type gaiePicker struct {
	scheduler *scheduling.Scheduler
	producer  interface {
		requestcontrol.PrepareDataPlugin
		requestcontrol.PreRequest
	}
	parser  *openai.OpenAIParser
	scraper *scraper
	config  string // the scheduler's configuration, as GAIE prints it
}

// newGAIEPicker builds the picker over a pool whose scraper already runs,
// as EPP builds its own when given no configuration: GAIE's loader reads
// its default configuration (the queue, kv-cache-utilization and
// prefix-cache scorers weighted 2, 2 and 3), instantiates the plugins,
// adds the max-score picker, the single-profile handler and the
// approximate prefix-cache producer the prefix scorer needs, and returns
// the scheduler's configuration.
func newGAIEPicker(ctx context.Context, s *scraper) (*gaiePicker, error) {
	registerPickerPlugins()
	raw, _, err := loader.LoadRawConfig(nil, logr.Discard())
	if err != nil {
		return nil, err
	}
	// The handle is what EPP gives plugins; the prefix producer only asks
	// it for the pool's members, to forget servers that left.
	handle := fwkplugin.NewEppHandle(ctx, s.names)
	cfg, err := loader.InstantiateAndConfigure(raw, handle, logr.Discard())
	if err != nil {
		return nil, err
	}
	producer, ok := handle.Plugin(approximateprefix.ApproxPrefixCachePluginType).(interface {
		requestcontrol.PrepareDataPlugin
		requestcontrol.PreRequest
	})
	if !ok {
		return nil, fmt.Errorf("the loader made no prefix-cache producer: %s", cfg.SchedulerConfig)
	}
	return &gaiePicker{scheduler: scheduling.NewSchedulerWithConfig(cfg.SchedulerConfig), producer: producer,
		parser: openai.NewOpenAIParser(), scraper: s, config: cfg.SchedulerConfig.String()}, nil
}

// registerPickerPlugins registers the factories of the plugins that EPP's
// default configuration names or that its loader adds, as EPP's runner
// does at start.
func registerPickerPlugins() {
	for name, factory := range map[string]fwkplugin.FactoryFunc{
		queuedepth.QueueScorerType:                      queuedepth.QueueScorerFactory,
		kvcacheutilization.KvCacheUtilizationScorerType: kvcacheutilization.KvCacheUtilizationScorerFactory,
		prefix.PrefixCacheScorerPluginType:              prefix.PrefixCachePluginFactory,
		picker.MaxScorePickerType:                       picker.MaxScorePickerFactory,
		profile.SingleProfileHandlerType:                profile.SingleProfileHandlerFactory,
		sourcemetrics.MetricsDataSourceType:             sourcemetrics.MetricsDataSourceFactory,
		extractormetrics.MetricsExtractorType:           extractormetrics.CoreMetricsExtractorFactory,
		openai.OpenAIParserType:                         openai.OpenAIParserPluginFactory,
		utilization.UtilizationDetectorType:             utilization.UtilizationDetectorFactory,
		fairness.GlobalStrictFairnessPolicyType:         fairness.GlobalStrictFairnessPolicyFactory,
		ordering.FCFSOrderingPolicyType:                 ordering.FCFSOrderingPolicyFactory,
		usagelimits.StaticUsageLimitPolicyType:          usagelimits.StaticPolicyFactory,
	} {
		fwkplugin.Register(name, factory)
	}
}

func (g *gaiePicker) route(ctx context.Context, id string, body []byte) (int, error) {
	parsed, err := g.parser.ParseRequest(ctx, body, map[string]string{":path": "/v1/chat/completions"})
	if err != nil {
		return 0, err
	}
	req := &fwksched.LLMRequest{RequestId: id, TargetModel: "tiny-llama", Body: parsed, RequestSizeBytes: len(body)}
	endpoints := g.scraper.endpoints()
	if err := g.producer.PrepareRequestData(ctx, req, endpoints); err != nil {
		return 0, err
	}
	res, err := g.scheduler.Schedule(ctx, req, endpoints)
	if err != nil {
		return 0, err
	}
	g.producer.PreRequest(ctx, req, res)
	target := res.ProfileResults[res.PrimaryProfileName].TargetEndpoints
	if len(target) == 0 {
		return 0, fmt.Errorf("request %s: the scheduler picked no endpoint", id)
	}
	return strconv.Atoi(target[0].GetMetadata().NamespacedName.Name)
}

// scraper reads every server's /metrics with EPP's metrics client every
// eppRefresh, as EPP's refresh loop does, and keeps the last read.
type scraper struct {
	meta   []*fwkdl.EndpointMetadata
	client eppmetrics.PodMetricsClient

	mu   sync.Mutex
	last []*fwkdl.Metrics
}

// newScraper starts scraping servers until ctx ends and returns once
// each has been read once. A server is named by its index in the pool.
func newScraper(ctx context.Context, servers []*server) (*scraper, error) {
	client, err := eppmetrics.NewPodMetricsClientImpl(logr.Discard(), eppmetrics.Config{
		ModelServerMetricsScheme: "http", ModelServerMetricsPath: "/metrics",
		TotalQueuedRequestsMetric: "vllm:num_requests_waiting", TotalRunningRequestsMetric: "vllm:num_requests_running",
		KVCacheUsagePercentageMetric: "vllm:kv_cache_usage_perc", CacheInfoMetric: "vllm:cache_config_info"})
	if err != nil {
		return nil, err
	}
	s := &scraper{client: client, last: make([]*fwkdl.Metrics, len(servers))}
	for i, srv := range servers {
		host := strings.TrimPrefix(srv.base, "http://")
		s.meta = append(s.meta, &fwkdl.EndpointMetadata{
			NamespacedName: types.NamespacedName{Namespace: "pool", Name: strconv.Itoa(i)},
			Address:        host, MetricsHost: host})
	}
	for i := range servers {
		if err := s.scrape(ctx, i); err != nil {
			return nil, err
		}
		go s.loop(ctx, i)
	}
	return s, nil
}

func (s *scraper) loop(ctx context.Context, i int) {
	tick := time.NewTicker(eppRefresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			// A failed read keeps the last one, as EPP does.
			_ = s.scrape(ctx, i)
		}
	}
}

func (s *scraper) scrape(ctx context.Context, i int) error {
	s.mu.Lock()
	prev := s.last[i]
	s.mu.Unlock()
	if prev == nil {
		prev = fwkdl.NewMetrics()
	}
	m, err := s.client.FetchMetrics(ctx, s.meta[i], prev)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.last[i] = m
	s.mu.Unlock()
	return nil
}

// endpoints is the pool as the scheduler sees it now: a snapshot, as the
// director takes one per request.
func (s *scraper) endpoints() []fwksched.Endpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]fwksched.Endpoint, len(s.meta))
	for i, m := range s.meta {
		out[i] = fwksched.NewEndpoint(m, s.last[i], nil)
	}
	return out
}

func (s *scraper) metrics(i int) *fwkdl.Metrics {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[i].Clone()
}

func (s *scraper) names() []types.NamespacedName {
	out := make([]types.NamespacedName, len(s.meta))
	for i, m := range s.meta {
		out[i] = m.NamespacedName
	}
	return out
}
