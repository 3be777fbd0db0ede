# install(): exports a CMake package so an outside project can do
#   find_package(tcap CONFIG REQUIRED)   target_link_libraries(app PRIVATE tcap::tcap)
include(CMakePackageConfigHelpers)
install(TARGETS tcap EXPORT tcapTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tcap DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET tcap-inspect)
  install(TARGETS tcap-inspect RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT tcapTargets NAMESPACE tcap:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tcap)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tcapConfig.cmake.in
  ${PROJECT_BINARY_DIR}/tcapConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tcap)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tcapConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tcapConfig.cmake ${PROJECT_BINARY_DIR}/tcapConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tcap)
