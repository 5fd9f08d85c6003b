/* A stand-in libcudart.so.13 that the "cudart" toy variant links against, so that the preflight
 * can prove it refuses a host library needing the CUDA runtime by name. Never loaded. */
int cudaGetDeviceCount(int* count) {
  *count = 0;
  return 0;
}
