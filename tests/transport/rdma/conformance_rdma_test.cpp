// The bulk conformance suite (tests/transport/bulk/conformance_suite.cpp) on the rdma backend. Built
// into tessera_rdma_vm_test, so it runs inside the Soft-RoCE VM with the rdma-specific tests.
#include "tests/transport/bulk/conformance_suite.hpp"

INSTANTIATE_TEST_SUITE_P(rdma, bulk_conformance,
                         ::testing::Values(tessera::transport::bulk::backend_kind::rdma),
                         tessera::transport::bulk::testing::backend_name);
