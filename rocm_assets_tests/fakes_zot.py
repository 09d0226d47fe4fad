"""The Zot-like fake for the tests; it lives in `rocm_assets_tests.servers.fakes`, where
`rocm-assets bench` can start it too. Its modes (auth, search, fail) are described there."""

from rocm_assets_tests.servers.fakes import Auth as Auth, Failure as Failure, FakeZot as FakeZot
