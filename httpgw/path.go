package httpgw

import (
	"net/url"
	"strings"
)

// cleanSegments splits an escaped absolute path into its escaped segments
// with "." and ".." resolved, the encoded forms (%2e, %2E) counting as the
// dots they decode to. ok is false when the path is not absolute, leaves
// its root, holds a backslash, or hides a separator or a NUL in an escape
// (%2f, %5c, %00): an upstream may decode those into a path of its own.
// Empty segments ("//", a trailing "/") are kept as they are.
func cleanSegments(escaped string) (segs []string, ok bool) {
	if !strings.HasPrefix(escaped, "/") || strings.ContainsRune(escaped, '\\') {
		return nil, false
	}
	for _, seg := range strings.Split(escaped[1:], "/") {
		dec, err := url.PathUnescape(seg)
		if err != nil || strings.ContainsAny(dec, "/\\\x00") {
			return nil, false
		}
		switch dec {
		case ".":
			continue
		case "..":
			if len(segs) == 0 {
				return nil, false
			}
			segs = segs[:len(segs)-1]
			continue
		}
		segs = append(segs, seg)
	}
	return segs, true
}

// requestPath is the escaped path of a request as the client sent it (no
// query), or "" when the request names no path (CONNECT's authority form,
// OPTIONS *).
func requestPath(requestURI string, u *url.URL) string {
	if strings.HasPrefix(requestURI, "/") {
		p, _, _ := strings.Cut(requestURI, "?")
		return p
	}
	if u != nil && u.IsAbs() {
		return u.EscapedPath()
	}
	return ""
}

// upstreamPath maps a request's escaped path under the gateway's base to
// the escaped upstream path under prefix; ok is false when it is outside.
func upstreamPath(prefix, reqPath string) (escaped string, ok bool) {
	segs, ok := cleanSegments(reqPath)
	if !ok {
		return "", false
	}
	return prefix + "/" + strings.Join(segs, "/"), true
}

// insidePrefix reports whether the escaped path p is prefix itself or
// below it, matching whole segments ("/api-x" is not inside "/api"), and
// returns the rest ("" or "/...").
func insidePrefix(prefix, p string) (rest string, ok bool) {
	if prefix == "" {
		return p, true
	}
	if p == prefix {
		return "", true
	}
	if strings.HasPrefix(p, prefix+"/") {
		return p[len(prefix):], true
	}
	return "", false
}
