package console

import (
	"slices"
	"sort"

	"github.com/stepready/stepready/internal/readmodel"
)

// Layout constants of the DAG drawing, in SVG user units.
const (
	nodeW    = 170
	nodeH    = 52
	layerGap = 70
	nodeGap  = 24
	margin   = 10
)

// dagNode is a step placed in the drawing.
type dagNode struct {
	ID       int64
	Name     string
	State    string
	Attempts int32
	Max      int32
	// Map is a map step's progress (nil for any other step): the node draws it as a bar, DoneW and FailedW
	// wide (of mapBarW), the rest of the bar the elements still to finish.
	Map            *readmodel.MapProgress
	DoneW, FailedW int
	X, Y           int
	Layer          int
}

// mapBarW is the width of a map node's progress bar.
const mapBarW = nodeW - 16

// mapNode is the node of step s, with its progress bar when it is a map step.
func mapNode(s readmodel.Step) dagNode {
	n := dagNode{ID: s.ID, Name: s.Name, State: s.State, Attempts: s.Attempts, Max: deref(s.MaxAttempts), Map: s.Map}
	if s.Map != nil && s.Map.Total > 0 {
		n.DoneW = int(int64(mapBarW) * int64(s.Map.Done) / int64(s.Map.Total))
		n.FailedW = int(int64(mapBarW) * int64(s.Map.Failed) / int64(s.Map.Total))
	}
	return n
}

// dagEdge is a drawn dependency, from the bottom of the parent to the top of the child.
type dagEdge struct{ X1, Y1, X2, Y2 int }

// dagLayout is a laid-out DAG: nodes and edges in SVG coordinates and the drawing's size.
type dagLayout struct {
	Nodes         []dagNode
	Edges         []dagEdge
	Width, Height int
}

// layoutDAG places the steps in dependency layers: a step's layer is the length of the longest path from a root
// to it (longest-path layering), and within a layer steps are ordered by the barycenter of their parents'
// positions (one downward sweep, then one upward sweep by children) to reduce edge crossings. nodes must be
// ordered by id; edges name parent and child ids.
func layoutDAG(nodes []dagNode, edges [][2]int64) dagLayout {
	index := make(map[int64]int, len(nodes))
	for i, n := range nodes {
		index[n.ID] = i
	}
	parents := make([][]int, len(nodes))
	children := make([][]int, len(nodes))
	for _, e := range edges {
		p, okp := index[e[0]]
		c, okc := index[e[1]]
		if !okp || !okc {
			continue
		}
		parents[c] = append(parents[c], p)
		children[p] = append(children[p], c)
	}

	// Longest-path layering by Kahn's topological order (the graph is acyclic: create_task refuses cycles).
	layer := make([]int, len(nodes))
	indeg := make([]int, len(nodes))
	for i := range nodes {
		indeg[i] = len(parents[i])
	}
	queue := []int{}
	for i := range nodes {
		if indeg[i] == 0 {
			queue = append(queue, i)
		}
	}
	for len(queue) > 0 {
		i := queue[0]
		queue = queue[1:]
		for _, c := range children[i] {
			layer[c] = max(layer[c], layer[i]+1)
			if indeg[c]--; indeg[c] == 0 {
				queue = append(queue, c)
			}
		}
	}

	depth := 0
	for _, l := range layer {
		depth = max(depth, l+1)
	}
	layers := make([][]int, depth)
	for i := range nodes {
		layers[layer[i]] = append(layers[layer[i]], i)
	}
	pos := make([]float64, len(nodes))
	setPos := func(l []int) {
		for k, i := range l {
			pos[i] = float64(k)
		}
	}
	for _, l := range layers {
		setPos(l)
	}
	bary := func(i int, of [][]int) float64 {
		if len(of[i]) == 0 {
			return pos[i]
		}
		sum := 0.0
		for _, j := range of[i] {
			sum += pos[j]
		}
		return sum / float64(len(of[i]))
	}
	reorder := func(l []int, of [][]int) {
		b := make(map[int]float64, len(l))
		for _, i := range l {
			b[i] = bary(i, of)
		}
		sort.SliceStable(l, func(a, c int) bool { return b[l[a]] < b[l[c]] })
		setPos(l)
	}
	for k := 1; k < depth; k++ {
		reorder(layers[k], parents)
	}
	for k := depth - 2; k >= 0; k-- {
		reorder(layers[k], children)
	}

	widest := 0
	for _, l := range layers {
		widest = max(widest, len(l))
	}
	width := 2*margin + widest*nodeW + max(widest-1, 0)*nodeGap
	out := dagLayout{Width: max(width, 2*margin+nodeW), Height: 2*margin + depth*nodeH + max(depth-1, 0)*layerGap}
	placed := slices.Clone(nodes)
	for k, l := range layers {
		rowW := len(l)*nodeW + max(len(l)-1, 0)*nodeGap
		x0 := (out.Width - rowW) / 2
		for j, i := range l {
			placed[i].X = x0 + j*(nodeW+nodeGap)
			placed[i].Y = margin + k*(nodeH+layerGap)
			placed[i].Layer = k
		}
	}
	for c := range nodes {
		for _, p := range parents[c] {
			out.Edges = append(out.Edges, dagEdge{
				X1: placed[p].X + nodeW/2, Y1: placed[p].Y + nodeH,
				X2: placed[c].X + nodeW/2, Y2: placed[c].Y,
			})
		}
	}
	out.Nodes = placed
	return out
}
