package maintenance_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// mustCounter returns the unlabelled counter name of b's registry.
func mustCounter(t *testing.T, b *testBundle, name string) prometheus.Collector {
	t.Helper()
	return mustMetric(t, b, name, "", "")
}

// mustGauge returns the gauge name{label=value} of b's registry, copied into a collector testutil can read.
func mustGauge(t *testing.T, b *testBundle, name, label, value string) prometheus.Collector {
	t.Helper()
	return mustMetric(t, b, name, label, value)
}

func mustMetric(t *testing.T, b *testBundle, name, label, value string) prometheus.Collector {
	t.Helper()
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || (l.GetName() == label && l.GetValue() == value)
			}
			if !match {
				continue
			}
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "copy"})
			switch {
			case m.GetGauge() != nil:
				g.Set(m.GetGauge().GetValue())
			case m.GetCounter() != nil:
				g.Set(m.GetCounter().GetValue())
			}
			return g
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return nil
}
