package models

// Platform is the model's platform in metadata: "stepserve_" and its
// architecture.
func (m *Model) Platform() string { return "stepserve_" + m.Config.Architecture }
