package steps

import (
	"fmt"
	"sort"
	"sync"
)

// Registry maps handler names (steps.handler) to handlers. It is safe for concurrent use; handlers are normally
// registered before the daemon starts.
type Registry struct {
	mu       sync.RWMutex
	handlers map[string]Handler
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{handlers: map[string]Handler{}} }

// Register adds h under name. An empty name, a nil handler or a name already taken is an error.
func (r *Registry) Register(name string, h Handler) error {
	if name == "" {
		return fmt.Errorf("steps: register: empty handler name")
	}
	if h == nil {
		return fmt.Errorf("steps: register %q: nil handler", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.handlers[name]; ok {
		return fmt.Errorf("steps: register %q: a handler with that name is already registered", name)
	}
	r.handlers[name] = h
	return nil
}

// MustRegister is Register that panics on error; for package-level setup.
func (r *Registry) MustRegister(name string, h Handler) {
	if err := r.Register(name, h); err != nil {
		panic(err)
	}
}

// Lookup returns the handler registered under name.
func (r *Registry) Lookup(name string) (Handler, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	h, ok := r.handlers[name]
	return h, ok
}

// Names returns the registered handler names, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.handlers))
	for n := range r.handlers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
