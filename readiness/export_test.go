package readiness

import "time"

// WithFetchCooldown returns cfg with River's FetchCooldown set to d (a test can make River's own insert
// announcements rare).
func WithFetchCooldown(cfg RiverConfig, d time.Duration) RiverConfig {
	cfg.fetchCooldown = d
	return cfg
}
