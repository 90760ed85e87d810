"""cuDNN 9 (libcudnn.so.9) through the proxy: the legacy API (cudnn_ops, cudnn_cnn, cudnn_adv) and the backend API
(cudnn_graph), which cudnn-frontend and PyTorch use for convolutions.

Data, workspace and reserve-space pointers are device memory.  alpha and beta are host memory, a double where the
call's output tensor holds doubles and a float otherwise (cuDNN's rule): the shim keeps each tensor and filter
descriptor's data type from its setter.  Handles and legacy descriptors are handles made by their Create functions;
backend descriptors (`void *` in the header) are handles too.  A backend attribute's elements are typed by its
cudnnBackendAttributeType_t (ELEMENT_TYPES): descriptors and cuDNN handles among them are translated to the proxy's
objects, VOID_PTR elements are device pointers passed as they are, the rest plain data.  Objects the program
destroyed while another object's configuration still names them are made again at a restore and destroyed after
(KEEP_REFERENCED): a finalized operation graph keeps the operations it was given.  Dropout states are device memory
the checkpoint saves: a restore sets the descriptor with cudnnRestoreDropoutDescriptor, which does not initialise
them again (REPLAY_AS)."""

STATUS_TYPES = ("cudnnStatus_t",)
STATUS = {"success": 0, "invalid_handle": 2000, "invalid_value": 2000, "internal": 4000, "not_supported": 3000}
MAIN_HANDLES = ("cudnnHandle_t",)
HANDLE_TYPES = {"cudnnBackendDescriptor_t": "cudnnBackendDescriptor_t"}
CONFIG = (r"^cudnn(Set(?!Tensor$)|Restore|Derive|InitTransformDest|RNNSetClip)"
          r"|^cudnnBackend(SetAttribute|GetAttribute|Finalize|Initialize)$")
CONFIG_KEYS = r"attributeName"
UNORDERED = (r"^cudnn(Get|Set(?!Tensor$)|Create|Destroy|Restore|Derive|Find|Query|InitTransformDest|RNNGetClip"
             r"|RNNSetClip|DropoutGet|LongFFTCausalConv1dGetBufferSizes|\w+VersionCheck)|^cudnnBackend(?!Execute)")
# answers that never change in a process: the shim asks the proxy once
CONSTANT = r"^cudnn(Get(Version|MaxDeviceVersion|CudartVersion|Property|ErrorString)|\w+VersionCheck)$"
KEEP_REFERENCED = True
VOID_FORWARD = r"^cudnnGetLastErrorString$"  # (returns nothing: its answer is its message)
REPLAY_AS = {"cudnnSetDropoutDescriptor": "cudnnRestoreDropoutDescriptor"}

# cudnnBackendAttributeType_t -> (bytes of one element, what it is: "" plain data, "dev" a device pointer, or the
# handle type whose ids the proxy translates)
ELEMENT_TYPES = {
    0: (8, "cudnnHandle_t"), 1: (4, ""), 2: (1, ""), 3: (8, ""), 4: (4, ""), 5: (8, ""), 6: (8, "dev"),
    **{t: (4, "") for t in (7, 8, 9, 10, 11, 12, 13, 14, 16, 17, 18, 19, 20, 21, 22, 23, 25, 27, 28, 29, 30, 31,
                            32, 33)},
    15: (8, "cudnnBackendDescriptor_t"), 24: (1, ""), 26: (16, ""),
}
# the tensor a call writes, whose data type gives alpha's and beta's: the first of these the function has
ALIASES = {"OUT": ["yDesc", "dxDesc", "dwDesc", "dbDesc", "cDesc", "destDesc", "dXdMeansDesc", "xDesc"]}

_DIMS = r"^(dimA|strideA|filterDimA|padA|filterStrideA|dilationA|windowDimA|paddingA|padBeforeA|padAfterA)$"
_FAILED_QUERY = "it answers with a descriptor or callback of the library's own"

PARAMS = [
    (r"^cudnnBackendSetAttribute$", r"^arrayOfElements$", "",
     "elems:nvpl_elem_size(LIB, attributeType)*elementCount@attributeType"),
    (r"^cudnnBackendGetAttribute$", r"^arrayOfElements$", "",
     "elemsout:nvpl_elem_size(LIB, attributeType)*requestedElementCount@attributeType"),
    (r"^cudnnBackendGetAttribute$", r"^elementCount$", "", "out"),
    (r"", r"^(alpha|beta)\w*$", r"^void c\*$", "in:nvpl_dnn_scale(OUT)"),
    (r"^cudnnSetTensor$", r"^valuePtr$", "", "in:nvpl_dnn_dtype_size(nvpl_handle_dtype(yDesc))"),
    (r"^cudnnSet(RNNData|SeqData)Descriptor$", r"^paddingFill$", "", "in:nvpl_dnn_dtype_size(dataType)"),
    (r"^cudnnSetRNNDataDescriptor$", r"^seqLengthArray$", "", "in:4*batchSize"),
    (r"^cudnnSetSeqDataDescriptor$", r"^seqLengthArray$", "", "in:4*seqLengthArraySize"),
    (r"^cudnnSetSeqDataDescriptor$", r"^axes$", "", "in:4*nbDims"),
    (r"^cudnnSet\w*Descriptor(Ex)?$", _DIMS, r"c\*$", "in:4*N"),
    (r"^cudnnSetTensorTransformDescriptor$", r"^foldA$", "", "in:4*(nbDims > 2 ? nbDims - 2 : 0)"),
    (r"^cudnnGet\w*Descriptor$", _DIMS, r"\*$", "out:4*NREQ"),
    (r"^cudnnGetTensorTransformDescriptor$", r"^foldA$", "", "out:4*(nbDimsRequested > 2 ? nbDimsRequested - 2 : 0)"),
    (r"OutputDim$", r"DimA$", r"\*$", "out:4*nbDims"),
    (r"^cudnn(Get|Find)\w*Algorithm(Ex|_v7)?$", r"^perfResults$", "", "out:elem*requestedAlgoCount"),
    (r"", r"^(returnedAlgoCount|count)$", r"^int \*$", "out"),
    (r"", r"(Size|SizeInBytes|sizeInBytes)$", r"^size_t \*$", "out"),
    (r"^cudnnGetLastErrorString$", r"^message$", "", "out:max_size"),
    (r"^cudnnQueryRuntimeError$", r"^rstatus$", "", "out"),
    (r"^cudnnQueryRuntimeError$", r"^tag$", "", "dev"),  # (must be NULL: the library says so)
    (r"^cudnnGet(RNNWeightParams|MultiHeadAttnWeights)$", r"^(mAddr|bAddr|wAddr)$", "", "out"),
    (r"^cudnnGetDropoutDescriptor$", r"^states$", "", "out"),
    (r"^cudnnGet(RNNData|SeqData)Descriptor$", r"^paddingFill$", "", "fail"),
    (r"^cudnnGet(RNNData|SeqData)Descriptor$", r"^seqLengthArray$", "", "out:4*SEQREQ"),
    (r"^cudnnGetSeqDataDescriptor$", r"^(dimA|axes)$", "", "out:4*nbDimsRequested"),
    (r"^cudnnGet\w*$|^cudnnRNNGetClip|^cudnnLongFFTCausalConv1dGetBufferSizes$|^cudnnInitTransformDest$", r"",
     r"^\w+ \*$", "out"),
    (r"", r"", r"^(void|int|int32_t|float) c?\*$", "dev"),
]
ALIASES |= {"N": ["nbDims", "arrayLength"], "NREQ": ["nbDimsRequested", "arrayLengthRequested"],
            "SEQREQ": ["arrayLengthRequested", "seqLengthSizeRequested"]}

FUNCTION_RULES = [
    (r"^cudnn(Set|Get)Callback$", {"how": "fail", "why": "a callback into the application"}),
    (r"FusedOps", {"how": "fail", "why": "fused-ops parameter packs (pointers and descriptors by label) are not "
                   "described"}),
    (r"^cudnnBackend(Populate|Update)CudaGraph$", {"how": "fail", "why": "CUDA graphs built by cuDNN are not "
                                                  "forwarded; use cudnnBackendExecute"}),
    (r"^cudnnCTCLoss$|^cudnnGetCTCLossWorkspaceSize$", {"how": "fail", "why": "its host label arrays are not "
                                                        "described; use the _v8 function"}),
    (r"^cudnnMultiHeadAttn(Forward|BackwardData)$", {"how": "fail", "why": "its host attention-window arrays are "
                                                     "not described"}),
    (r"^cudnnGnn", {"how": "fail", "why": "its graph and parameter structures hold pointers that are not "
                    "described"}),
    (r"^cudnnGet(AttnDescriptor|RNNDescriptor_v8)$", {"how": "fail", "why": _FAILED_QUERY}),
    (r"^cudnnInitTransformDest$", {"owner": "destDesc"}),
    (r"^cudnnBackend(Set|Get)Attribute$", {"owner": "descriptor"}),
]

FUNCTIONS = {
    "cudnnGetStream": {"local": "nvpl_get_stream(handle, streamId)"},
    "cudnnSetStream": {"after": "nvpl_note_stream(handle, streamId)"},
    "cudnnSetTensor4dDescriptor": {"after": "nvpl_note_dtype(tensorDesc, dataType)"},
    "cudnnSetTensor4dDescriptorEx": {"after": "nvpl_note_dtype(tensorDesc, dataType)"},
    "cudnnSetTensorNdDescriptor": {"after": "nvpl_note_dtype(tensorDesc, dataType)"},
    "cudnnSetTensorNdDescriptorEx": {"after": "nvpl_note_dtype(tensorDesc, dataType)"},
    "cudnnSetFilter4dDescriptor": {"after": "nvpl_note_dtype(filterDesc, dataType)"},
    "cudnnSetFilterNdDescriptor": {"after": "nvpl_note_dtype(filterDesc, dataType)"},
}
