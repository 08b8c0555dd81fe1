package textapi

import "github.com/stepserve/stepserve/server/core"

// API is the text APIs' door (OpenAI's and TEI's) over the core it is
// built on.
type API struct {
	c *core.Core
	textAPIState
}

// New builds the text APIs over c.
func New(c *core.Core) *API { return &API{c: c} }
