package console

import (
	"slices"
	"testing"
)

func TestSeries(t *testing.T) {
	for _, tc := range []struct {
		size   int
		add    []int
		want   []int
		last   int
		hasAny bool
	}{
		{size: 3, add: nil, want: []int{}},
		{size: 3, add: []int{1, 2}, want: []int{1, 2}, last: 2, hasAny: true},
		{size: 3, add: []int{1, 2, 3}, want: []int{1, 2, 3}, last: 3, hasAny: true},
		{size: 3, add: []int{1, 2, 3, 4, 5}, want: []int{3, 4, 5}, last: 5, hasAny: true},
		{size: 0, add: []int{1, 2}, want: []int{2}, last: 2, hasAny: true},
	} {
		s := NewSeries[int](tc.size)
		for _, v := range tc.add {
			s.Add(v)
		}
		if got := s.Values(); !slices.Equal(got, tc.want) {
			t.Errorf("size %d add %v: Values %v, want %v", tc.size, tc.add, got, tc.want)
		}
		if last, ok := s.Last(); ok != tc.hasAny || last != tc.last {
			t.Errorf("size %d add %v: Last %d %v, want %d %v", tc.size, tc.add, last, ok, tc.last, tc.hasAny)
		}
	}
}
