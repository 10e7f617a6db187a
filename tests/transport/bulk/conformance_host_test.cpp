// The conformance suite on the backends every host has: tcp and shm.
#include "tests/transport/bulk/conformance_suite.hpp"

INSTANTIATE_TEST_SUITE_P(host, bulk_conformance,
                         ::testing::Values(tessera::transport::bulk::backend_kind::tcp,
                                           tessera::transport::bulk::backend_kind::shm),
                         tessera::transport::bulk::testing::backend_name);
