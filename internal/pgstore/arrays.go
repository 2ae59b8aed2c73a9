package pgstore

import "github.com/jackc/pgx/v5/pgtype"

// textArray and int8Array send a []string as text[] and a []int64 as
// bigint[] without boxing every element: pgx asks an array for each
// element as an any, and an element here is a pointer-shaped struct, which
// an interface holds without allocating. A checkpoint of n users costs a
// few allocations instead of 4n.
type (
	textArray []string
	int8Array []int64
	textElem  struct{ p *string }
	int8Elem  struct{ p *int64 }
)

func (a textArray) Dimensions() []pgtype.ArrayDimension { return dims(len(a), a == nil) }
func (a textArray) Index(i int) any                     { return textElem{&a[i]} }
func (a textArray) IndexType() any                      { return textElem{} }
func (e textElem) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: *e.p, Valid: true}, nil
}

func (a int8Array) Dimensions() []pgtype.ArrayDimension { return dims(len(a), a == nil) }
func (a int8Array) Index(i int) any                     { return int8Elem{&a[i]} }
func (a int8Array) IndexType() any                      { return int8Elem{} }
func (e int8Elem) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: *e.p, Valid: true}, nil
}

// dims returns the dimensions of a one-dimensional array of n elements;
// nil (SQL NULL) for a nil slice.
func dims(n int, isNil bool) []pgtype.ArrayDimension {
	if isNil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(n), LowerBound: 1}}
}
