package main

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLines feeds go test -json output of a build failure, a failing, a
// passing and a skipped test, and checks the lines printed and the verdict.
func TestLines(t *testing.T) {
	in := `{"ImportPath":"m/b [m/b.test]","Action":"build-output","Output":"# m/b [m/b.test]\n"}
{"ImportPath":"m/b [m/b.test]","Action":"build-fail"}
{"Action":"output","Package":"m/b","Output":"FAIL\tm/b [build failed]\n"}
{"Action":"fail","Package":"m/b","Elapsed":0,"FailedBuild":"m/b [m/b.test]"}
{"Action":"run","Package":"m","Test":"TestPass"}
{"Action":"output","Package":"m","Test":"TestPass","Output":"=== RUN   TestPass\n"}
{"Action":"pass","Package":"m","Test":"TestPass","Elapsed":1.5}
{"Action":"run","Package":"m","Test":"TestFail"}
{"Action":"run","Package":"m","Test":"TestFail/sub"}
{"Action":"output","Package":"m","Test":"TestFail/sub","Output":"    a_test.go:4: boom\n"}
{"Action":"fail","Package":"m","Test":"TestFail/sub","Elapsed":0}
{"Action":"fail","Package":"m","Test":"TestFail","Elapsed":0.25}
{"Action":"run","Package":"m","Test":"TestSkip"}
{"Action":"skip","Package":"m","Test":"TestSkip","Elapsed":0}
not json
{"Action":"output","Package":"m","Output":"FAIL\tm\t2.000s\n"}
{"Action":"fail","Package":"m","Elapsed":2}
`
	for _, tc := range []struct {
		name, in, want string
		failed         bool
	}{
		{"failures", in, "# m/b [m/b.test]\nFAIL\tm/b [build failed]\nok   m TestPass (1.50s)\n" +
			"    a_test.go:4: boom\nFAIL m TestFail (0.25s)\nskip m TestSkip (0.00s)\nnot json\nFAIL\tm\t2.000s\n", true},
		{"pass", `{"Action":"run","Package":"m","Test":"TestPass"}
{"Action":"pass","Package":"m","Test":"TestPass","Elapsed":1}
{"Action":"output","Package":"m","Output":"PASS\n"}
{"Action":"output","Package":"m","Output":"ok  \tm\t1.000s\n"}
{"Action":"pass","Package":"m","Elapsed":1}
`, "ok   m TestPass (1.00s)\nok  \tm\t1.000s\n", false},
		{"never ended", `{"Action":"run","Package":"m","Test":"TestHang"}
{"Action":"output","Package":"m","Test":"TestHang","Output":"panic: test timed out\n"}
`, "panic: test timed out\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			l := newLog(&out)
			l.read(strings.NewReader(tc.in))
			failed := l.finish()
			if got := out.String(); got != tc.want || failed != tc.failed {
				t.Errorf("got %q, failed %v; want %q, failed %v", got, failed, tc.want, tc.failed)
			}
		})
	}
}
