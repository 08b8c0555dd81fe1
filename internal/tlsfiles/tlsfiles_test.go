package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/internal/tlsfiles/tlstest"
)

func writePair(t *testing.T, dir, cn string) (certFile, keyFile string) {
	certFile, keyFile, _ = tlstest.WritePair(t, dir, cn)
	return certFile, keyFile
}

func commonName(t *testing.T, c *tls.Certificate) string {
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	require.NoError(t, err)
	return leaf.Subject.CommonName
}

// TestReplacedFilesAreServed: a pair replaced on disk is served from the
// next look at the files; a replacement that is not a pair leaves the
// last good one in place until it is.
func TestReplacedFilesAreServed(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writePair(t, dir, "first")
	p, err := Load(certFile, keyFile, nil)
	require.NoError(t, err)
	assert.Equal(t, "first", commonName(t, p.Certificate()))

	writePair(t, dir, "second")
	p.checked = time.Time{} // as if a second had passed
	assert.Equal(t, "second", commonName(t, p.Certificate()))

	require.NoError(t, os.WriteFile(keyFile, []byte("half written"), 0o600))
	p.checked = time.Time{}
	assert.Equal(t, "second", commonName(t, p.Certificate()), "a broken replacement keeps the last good pair")

	writePair(t, dir, "third")
	p.checked = time.Time{}
	assert.Equal(t, "third", commonName(t, p.Certificate()))
}

func TestLoadNamesWhatIsWrong(t *testing.T) {
	dir := t.TempDir()
	_, err := Load(filepath.Join(dir, "missing.crt"), filepath.Join(dir, "missing.key"), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "missing.crt")

	certFile, _ := writePair(t, dir, "a")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "other.key"), []byte("not a key"), 0o600))
	_, err = Load(certFile, filepath.Join(dir, "other.key"), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "other.key")
}
