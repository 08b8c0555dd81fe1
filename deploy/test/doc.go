// Package test checks what stepserve deploys and what watches it: the Helm
// chart rendered by Helm and decoded strictly into Kubernetes API types, the
// alert rules and dashboard's PromQL against the metrics the server really
// exports, and a real Prometheus scraping a real server until an alert
// fires.
//
// It is a module of its own so that the Kubernetes, prometheus-operator and
// Prometheus libraries it needs stay out of the server's dependencies. Run
// it with `make chart-test` (part of `make test`).
package test
