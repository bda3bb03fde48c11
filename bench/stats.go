package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// percentile returns the p-th percentile (0 < p <= 100, nearest rank) of d,
// which it sorts; 0 for no samples.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := int(math.Ceil(p/100*float64(len(d)))) - 1
	return d[max(0, min(i, len(d)-1))]
}

// ms converts d to milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// spread is one figure measured in several runs: its median and range.
type spread struct {
	vals []float64 // one per run; NaN for a run that had no value
}

func (s *spread) add(v float64) { s.vals = append(s.vals, v) }

// ok reports whether at least one run gave a value.
func (s spread) ok() bool {
	for _, v := range s.vals {
		if !math.IsNaN(v) {
			return true
		}
	}
	return false
}

func (s spread) sorted() []float64 {
	var v []float64
	for _, x := range s.vals {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	slices.Sort(v)
	return v
}

// median returns the median over the runs (NaN without any).
func (s spread) median() float64 {
	v := s.sorted()
	switch {
	case len(v) == 0:
		return math.NaN()
	case len(v)%2 == 1:
		return v[len(v)/2]
	default:
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
}

func (s spread) min() float64 {
	v := s.sorted()
	if len(v) == 0 {
		return math.NaN()
	}
	return v[0]
}

func (s spread) max() float64 {
	v := s.sorted()
	if len(v) == 0 {
		return math.NaN()
	}
	return v[len(v)-1]
}

// format prints the median with its unit and, over several runs, the
// range without it: "4.68 ms (4.57–5.81)". f formats a bare number.
func (s spread) format(f func(float64) string, unit string) string {
	if !s.ok() {
		return "n/a"
	}
	v := s.sorted()
	if len(v) == 1 {
		return f(v[0]) + unit
	}
	return fmt.Sprintf("%s%s (%s–%s)", f(s.median()), unit, f(v[0]), f(v[len(v)-1]))
}

// num formats a figure with a precision fitting its size.
func num(v float64) string {
	a := math.Abs(v)
	switch {
	case a == 0:
		return "0"
	case a >= 1000:
		return groupThousands(int64(math.Round(v)))
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

// ratio formats a ratio such as 1.14×; ratioNum without the sign.
func ratio(v float64) string    { return ratioNum(v) + "×" }
func ratioNum(v float64) string { return fmt.Sprintf("%.2f", v) }

// groupThousands formats n with commas: 1,000,000.
func groupThousands(n int64) string {
	s := fmt.Sprint(n)
	neg := false
	if n < 0 {
		neg, s = true, s[1:]
	}
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
