// Package triton is Triton's model configuration and statistics as both
// Triton doors (HTTP, server/admin; gRPC, server/grpcapi) answer them:
// the JSON form of model_config.proto's ModelConfig stepserve can state
// truly (config.go), the configuration a load request may override,
// read strictly against the proto (loadconfig.go), and the per-model
// statistics of the statistics extension (stats.go). It imports the core
// only for the error taxonomy, and no door.
package triton
