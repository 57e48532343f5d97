/*
 * Compiles strata.h alone as C: `gcc -std=c11 -Wall -Wextra -Werror -pedantic -c`.
 * Nothing but the header is included, so it must be self-contained. The prototypes are
 * checked by assigning each function to a pointer of the documented type, and the DLPack
 * structs against the DLPack 1.x ABI (LP64 sizes and offsets).
 */
#include "strata.h"

#if !defined(STRATA_VERSION_MAJOR) || !defined(STRATA_VERSION_MINOR) || !defined(STRATA_VERSION_PATCH)
#error "strata.h must define STRATA_VERSION_MAJOR/MINOR/PATCH"
#endif
#if STRATA_VERSION_NUMBER != STRATA_VERSION_MAJOR * 10000 + STRATA_VERSION_MINOR * 100 + STRATA_VERSION_PATCH
#error "STRATA_VERSION_NUMBER must be usable in #if and agree with MAJOR/MINOR/PATCH"
#endif
#if !defined(DLPACK_MAJOR_VERSION) || DLPACK_MAJOR_VERSION != 1
#error "strata.h must declare the DLPack 1.x ABI"
#endif

_Static_assert(STRATA_OK == 0, "STRATA_OK is zero");
_Static_assert(STRATA_INTERNAL == 12, "status values are ABI");
_Static_assert(sizeof(strata_status) == 4, "strata_status is 32 bits");
_Static_assert(sizeof(DLDevice) == 8, "DLDevice");
_Static_assert(sizeof(DLDataType) == 4, "DLDataType");
_Static_assert(sizeof(void *) != 8 || sizeof(DLTensor) == 48, "DLTensor (LP64)");
_Static_assert(sizeof(void *) != 8 || offsetof(DLTensor, byte_offset) == 40, "DLTensor.byte_offset (LP64)");
_Static_assert(sizeof(void *) != 8 || offsetof(DLManagedTensor, deleter) == 56, "DLManagedTensor (LP64)");
_Static_assert(sizeof(void *) != 8 || offsetof(DLManagedTensorVersioned, flags) == 24, "versioned.flags (LP64)");
_Static_assert(sizeof(void *) != 8 || offsetof(DLManagedTensorVersioned, dl_tensor) == 32, "versioned (LP64)");
_Static_assert(kDLCPU == 1 && kDLCUDA == 2 && kDLCUDAHost == 3, "DLDeviceType values");
_Static_assert(kDLInt == 0 && kDLUInt == 1 && kDLFloat == 2 && kDLBfloat == 4, "DLDataTypeCode values");
/* DLPack 1.3: kDLTrn, the fp8/fp6/fp4 codes and the exchange API table. */
_Static_assert(DLPACK_MINOR_VERSION == 3 && kDLTrn == 18 && kDLMAIA == 17, "DLDeviceType values (1.3)");
_Static_assert(kDLFloat8_e3m4 == 7 && kDLFloat8_e8m0fnu == 14 && kDLFloat4_e2m1fn == 17, "DLDataTypeCode values (1.1)");
_Static_assert(DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED == 4, "DLPack flags");
_Static_assert(sizeof(void *) != 8 || sizeof(DLPackExchangeAPIHeader) == 16, "DLPackExchangeAPIHeader (LP64)");
_Static_assert(sizeof(void *) != 8 || offsetof(DLPackExchangeAPI, current_work_stream) == 48, "DLPackExchangeAPI (LP64)");

/* Every export, with the type the documentation promises. */
const char *(*const p_version)(void) = strata_version;
const char *(*const p_last_error)(void) = strata_last_error;
const char *(*const p_status_name)(int32_t) = strata_status_name;
int32_t (*const p_default_threads)(void) = strata_default_num_threads;
strata_lookup_options (*const p_lookup_defaults)(void) = strata_lookup_options_default;
strata_table_options (*const p_table_defaults)(void) = strata_table_options_default;
strata_status (*const p_lookup)(strata_table *, const DLTensor *, DLTensor *, const strata_lookup_options *,
                                strata_lookup_stats *) = strata_lookup;
strata_status (*const p_lookup_managed)(strata_table *, const DLManagedTensor *, DLManagedTensor *,
                                        const strata_lookup_options *, strata_lookup_stats *) = strata_lookup_managed;
strata_status (*const p_lookup_versioned)(strata_table *, const DLManagedTensorVersioned *,
                                          DLManagedTensorVersioned *, const strata_lookup_options *,
                                          strata_lookup_stats *) = strata_lookup_managed_versioned;
strata_status (*const p_from_dlpack)(const DLTensor *, const DLTensor *, const strata_table_options *,
                                     strata_table **) = strata_table_from_dlpack;
strata_status (*const p_adopt)(DLManagedTensor *, const DLTensor *, const strata_table_options *,
                               strata_table **) = strata_table_adopt_dlpack;
strata_status (*const p_adopt_versioned)(DLManagedTensorVersioned *, const DLTensor *, const strata_table_options *,
                                         strata_table **) = strata_table_adopt_dlpack_versioned;
strata_status (*const p_open)(const char *, int64_t, const strata_table_options *, strata_table **) =
    strata_table_open;
void (*const p_free)(strata_table *) = strata_table_free;
int64_t (*const p_dim)(const strata_table *) = strata_table_dim;
int64_t (*const p_len)(const strata_table *) = strata_table_len;
strata_status (*const p_info)(const strata_table *, struct strata_table_info *) = strata_table_get_info;

/* The option and result structs have the documented fields. */
int header_c_uses_fields(void);
int header_c_uses_fields(void) {
    strata_lookup_options lo = {sizeof(strata_lookup_options), NULL, 0};
    strata_lookup_stats st = {sizeof(strata_lookup_stats), 0, 0, 0, 0};
    strata_table_options to = {sizeof(strata_table_options), 0.0f, STRATA_MISSING_FILL, STRATA_GPU_CACHE, 0.5f, 0.9f,
                               STRATA_GPU_REPLICATE, STRATA_STORAGE_INT8};
    struct strata_table_info info = {sizeof(struct strata_table_info), 0, 0, {kDLFloat, 32, 1}, false, false, false, 0, 0, STRATA_STORAGE_FLOAT32, 0};
    strata_missing_key mk = STRATA_MISSING_ERROR;
    DLManagedTensorVersioned v = {{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION}, NULL, NULL,
                                  DLPACK_FLAG_BITMASK_READ_ONLY, {NULL, {kDLCPU, 0}, 0, {kDLInt, 64, 1}, NULL, NULL, 0}};
    return (int)(lo.num_threads + (int32_t)st.hits + (int)to.missing_key + (int)to.gpu_placement + (int)info.rows + (int)mk +
                 (int)v.flags);
}
